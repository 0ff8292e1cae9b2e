"""Issue 19 item 2: every runtime dependency's declared floor is tested.

A venv gets exactly the declared minimum of every runtime dependency of ``pyproject.toml`` (``pip install
--constraint`` with ``name==floor`` for each, generated from the floors here), plus the test tools at their
current versions, and runs a smoke subset of the suite against the source tree: the CLI, the daemon with a
model server from a Jupyter config file, a real kernel running ``%%agent`` through nbclient, and a real Jupyter
server with the extension. A floor that cannot be installed (it contradicts another floor's own requirements)
or does not work fails here. Needs PyPI (CI and developers reach it); a few minutes, marked slow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
#: test tools for the smoke subset, unpinned (they must accept the floors, or resolution fails)
TOOLS = ["pytest", "pytest-asyncio", "pytest-timeout", "pytest-jupyter[server]", "nbclient", "nbformat",
         "hypothesis", "packaging"]
SMOKE = [
    "tests/install/test_cli_app.py",
    "tests/kernel/test_client_name.py",
    "tests/kernel/test_rendering.py",
    "tests/daemon/test_runner_paths.py",
    "tests/daemon/test_jupyter_config.py::test_a_daemon_uses_the_openai_server_of_jupyter_server_config_py",
    "tests/daemon/test_headless_identity.py",
    "tests/server/test_server_logs.py",
    "tests/core/test_gate.py",
]


def floors() -> dict[str, str]:
    """``{name: floor}`` for every runtime dependency (the version of its ``>=``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out: dict[str, str] = {}
    for line in project["dependencies"]:
        req = Requirement(line)
        lows = [s.version for s in req.specifier if s.operator == ">="]
        out[req.name] = lows[0] if lows else ""
    return out


def test_every_runtime_dependency_declares_a_floor() -> None:
    missing = [name for name, low in floors().items() if not low]
    assert not missing, f"no >= floor for {missing}"


@pytest.fixture(scope="module")
def min_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("min-venv")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    constraints = where / "constraints.txt"
    constraints.write_text("".join(f"{name}=={low}\n" for name, low in floors().items()))
    requirements = where / "requirements.txt"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements.write_text("\n".join(project["dependencies"]) + "\n")
    # the project venv's pip installs into the new one (pip --python): a venv made by a system python may have
    # no pip of its own (Makefile mcp-peers does the same)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--quiet", "--disable-pip-version-check", "--constraint", str(constraints),
                           "-r", str(requirements), *TOOLS], capture_output=True, text=True, timeout=1500, check=False)
    if done.returncode != 0:
        errors = [ln for ln in done.stderr.splitlines() if not ln.startswith("WARNING: Location")]
        pytest.fail("the declared minimums do not install together:\n" + "\n".join(errors[-40:]))
    # the package itself from the source tree, as an editable install links it (a .pth; building the wheel needs
    # node), and the server extension enabled as the wheel's shared-data enables it
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "relay_jupyter_src.pth").write_text(f"{ROOT}\n")
    confd = venv / "etc" / "jupyter" / "jupyter_server_config.d"
    confd.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "jupyter-config" / "server-config" / "relay_jupyter.json", confd)
    return venv


def test_the_minimums_are_what_is_installed(min_venv: Path) -> None:
    code = ("import json, importlib.metadata as m, sys\n"
            "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))")
    import json

    found = json.loads(subprocess.run([str(min_venv / "bin" / "python"), "-c", code, *floors()], capture_output=True,
                                      text=True, check=True, timeout=60).stdout)
    wrong = {n: (found[n], low) for n, low in floors().items() if Version(found[n]) != Version(low)}
    assert not wrong, f"installed != declared floor: {wrong}"


def test_the_smoke_subset_passes_on_the_minimums(min_venv: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{min_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # (a source scan of the kernel's HTML building says nothing about the floors)
    skip = "tests/kernel/test_rendering.py::test_no_kernel_code_builds_html_around_the_renderer"
    done = subprocess.run([str(min_venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "relay_jupyter.testing.pytest_plugin", "-m", "not browser and not peer",
                           "--deselect", skip, *SMOKE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, (done.stdout[-6000:], done.stderr[-3000:])
