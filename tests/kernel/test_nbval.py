"""nbval runs a notebook whose agent asks for a write: the headless deny policy answers, nothing hangs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .fake_broker import FakeBroker

NOTEBOOK = Path(__file__).parent / "notebooks" / "deny_policy.ipynb"


@pytest.mark.slow
def test_nbval_with_deny_policy(tmp_path: Path) -> None:
    with FakeBroker() as fake:
        fake.script([("permission", {"tool": "write_file", "arguments": {"path": "notes.txt", "text": "x"}}),
                     ("text", "I could not write the file.")])
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env.update(fake.env(), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), IPYTHONDIR=str(tmp_path / "ip"))
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", str(NOTEBOOK),
             "--rootdir", str(tmp_path), "-o", "filterwarnings=", "-W", "ignore"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        assert "3 passed" in result.stdout
        assert [a["decision"] for a in fake.answers] == ["deny"]
