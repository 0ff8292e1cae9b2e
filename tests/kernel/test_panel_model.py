"""The side panel's model under plain Node (issue 13: unit tests of the panel's model).

``labextension/src/model.ts`` holds the pure functions the panel builds its rows from (visible text, local
times, the offered answer scopes, the audit filter, the budget line); ``labextension/test/model.test.mjs``
tests them with ``node:test`` against the compiled ``lib/model.js`` (``make labext`` builds it before the suite).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

LABEXT = Path(__file__).resolve().parents[2] / "labextension"


def test_panel_model_unit_tests_pass_under_node() -> None:
    node = shutil.which("node")
    assert node, "node is needed to build the side panel (make labext) and to test its model"
    assert (LABEXT / "lib" / "model.js").exists(), "build the side panel first: make labext"
    done = subprocess.run([node, "--experimental-default-type=module", "--test", "test/"], cwd=LABEXT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"^# pass (\d+)$", done.stdout, re.M)
    assert "# fail 0" in done.stdout and passed and int(passed.group(1)) >= 6, done.stdout[-2000:]
