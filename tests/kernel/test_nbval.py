"""nbval runs a notebook whose agent asks for a write: the headless deny policy answers, nothing hangs; a
consent that times out fails its cell (one line), so nbval does not pass it."""

from __future__ import annotations

import json
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


def _notebook(path: Path, sources: list[str]) -> None:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": source} for i, source in enumerate(sources)]
    path.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}))


@pytest.mark.slow
def test_nbval_stops_at_a_timed_out_consent(tmp_path: Path) -> None:
    # cards are on (nobody will click) and the broker times the request out: before issue 11 this cell
    # ended "✓ done" and nbval passed it; now it is an error output with one PERMISSION_TIMEOUT line
    notebook = tmp_path / "timeout.ipynb"
    _notebook(notebook, ["%load_ext relay_jupyter\n%config AgentMagics.consent_ui = 'widget'",
                         "%%agent\nWrite notes.txt.", "print('after')"])
    with FakeBroker() as fake:
        fake.script([("permission", {"tool": "write_file", "arguments": {"path": "notes.txt"}},
                      {"timeout_after": 0.5}),
                     ("text", "I could not write the file.")])
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env.update(fake.env(), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), IPYTHONDIR=str(tmp_path / "ip"))
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", str(notebook),
             "--rootdir", str(tmp_path), "-o", "filterwarnings=", "-W", "ignore"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "1 failed, 2 passed" in result.stdout, result.stdout[-3000:]
    assert "FAILED timeout.ipynb::Cell 1 " in result.stdout, result.stdout[-3000:]  # the %%agent cell
    traceback = result.stdout.split("Traceback:", 1)[1].split("---", 1)[0]
    lines = [line for line in traceback.splitlines() if line.strip() and "\x1b[0m" != line.strip()]
    assert len(lines) == 1 and "timed out and was denied [PERMISSION_TIMEOUT]" in lines[0], traceback
    assert fake.answers == []  # the kernel never answered the ended request
