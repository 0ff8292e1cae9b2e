"""Issue 13: no user-facing cell of a documentation notebook imports the test package unless it needs a fake.
The private broker a notebook starts outside relay-enabled Jupyter is ``relay_jupyter.notebook_broker`` (it runs
the real daemon); ``relay_jupyter.testing`` is imported only for the fake model servers and their script helpers."""

from __future__ import annotations

import ast
import json
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
FAKES = {"FakeOpenAI", "FakeAnthropic", "Reply", "text", "tool_use", "Usage"}


def test_notebooks_import_testing_only_for_fakes() -> None:
    checked = 0
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            lines = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
            try:
                tree = ast.parse(lines)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("relay_jupyter.testing"):
                    checked += 1
                    names = {alias.name for alias in node.names}
                    assert node.module == "relay_jupyter.testing" and names <= FAKES, (path.name, node.module, names)
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        assert not alias.name.startswith("relay_jupyter.testing"), (path.name, alias.name)
    assert checked >= 1  # local_models.ipynb's fake OpenAI-compatible server is the one legitimate use
