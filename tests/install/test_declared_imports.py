"""Issue 19 item 2: every third-party module the package imports is declared in ``pyproject.toml``.

A module-level import must be a runtime dependency (it runs on every install); an import inside a function may
also come from an optional extra (``claude-code``, ``postgres``, ``hub``, ``plots``: the function says which to
install when it is missing). ``relay_jupyter/testing`` (the shipped pytest plugin and fakes) may import the test
tools of the ``test`` extra. Module names map to distributions through this venv's installed metadata.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "relay_jupyter"


def _names(lines: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(line).name) for line in lines}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(top-level module, at module level?)`` for each absolute import of ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], id(node) not in inside) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module.split(".")[0], id(node) not in inside))
    return out


def test_every_imported_third_party_module_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = _names(project["dependencies"])
    extras = {name: _names(lines) for name, lines in project["optional-dependencies"].items()}
    optional = set().union(*(v for k, v in extras.items() if k != "test"))
    dists = md.packages_distributions()
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        testing = path.is_relative_to(PACKAGE / "testing")
        for module, top in _imports(path):
            if module in sys.stdlib_module_names or module in ("relay_jupyter", "__future__"):
                continue
            found = {canonicalize_name(d) for d in dists.get(module, [])}
            if not found:
                problems.append(f"{path.relative_to(ROOT)}: {module} is not installed here (which package?)")
                continue
            allowed = runtime | (extras["test"] if testing else set()) | (set() if top else optional)
            if not found & allowed:
                where = "imported at module level: must be a runtime dependency" if top else \
                    "must be a runtime dependency or in an extra"
                problems.append(f"{path.relative_to(ROOT)}: {module} ({', '.join(sorted(found))}) {where}")
    assert not problems, "\n".join(problems)


def test_the_check_catches_an_undeclared_import(tmp_path: Path) -> None:
    # the parser sees module-level and function-level imports apart (the test above cannot pass vacuously)
    sample = tmp_path / "m.py"
    sample.write_text("import yaml\nfrom x.y import z\ndef f():\n    import psycopg\n    from . import q\n")
    assert _imports(sample) == [("yaml", True), ("x", True), ("psycopg", False)]
