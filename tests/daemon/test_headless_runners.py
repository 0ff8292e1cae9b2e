"""Issue 19 item 4: papermill and nbclient (``jupyter execute``) runs of two different notebooks against one daemon
are two origins: separate grants, separate budgets, each with its own audit rows.

The kernel learns its notebook from the runner's command line (kernel/discovery.py ``runner_notebook``: the
kernel's parent process is the runner); nothing tells it ``RELAY_NOTEBOOK`` here. Real parts: ``jupyter relay
serve`` on a Unix socket (demo backend), the real ``papermill`` and ``jupyter-execute`` commands of this venv."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from daemon_harness import env_for, run_cli, start_daemon

from relay_jupyter.kernel.discovery import client_name_for

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _write(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in ("%load_ext relay_jupyter", "%%agent\nhello")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def _outputs(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return json.dumps([c.get("outputs", []) for c in nb.cells])


def _audit(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "data" / "relay" / "audit-daemon.jsonl").read_text().splitlines()]


def test_papermill_and_jupyter_execute_notebooks_are_separate_origins(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/s/relay.sock")
    env = env_for(tmp_path)
    for key in [k for k in env if k.startswith(("RELAY_", "JPY_"))]:
        del env[key]
    env.update(RELAY_URL=daemon.address, CI="1")
    work = tmp_path / "work"
    weekly, daily = work / "weekly.ipynb", work / "reports" / "daily.ipynb"
    _write(weekly)
    _write(daily)
    # as given relative to the runner's working directory, resolved against it
    origin_w, origin_d = "daemon:" + client_name_for(str(weekly)), "daemon:" + client_name_for(str(daily))
    assert origin_w != origin_d

    def papermill(src: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "papermill"), str(src.relative_to(work)), str(tmp_path / "out.ipynb"),
                               "-k", "python3", "--no-progress-bar"], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300, check=False)

    def execute(src: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "jupyter-execute"), str(src.relative_to(work))], cwd=work, env=env,
                              capture_output=True, text=True, timeout=300, check=False)

    try:
        assert run_cli(tmp_path, "grants", "add", origin_w, "--tools", "*", "--models", "*",
                       "--budget", "tokens=1000000").returncode == 0
        done = papermill(weekly)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "[demo]" in _outputs(tmp_path / "out.ipynb")

        # the other notebook never connected: the weekly grant does not let it run; it is told its own origin
        done = execute(daily)
        assert done.returncode != 0
        assert "no relay grant" in done.stderr and f"grants add {origin_d} --tools" in done.stderr, done.stderr[-3000:]

        # its own tiny budget refuses it on its own spend (0 used), not on the weekly notebook's tokens
        assert run_cli(tmp_path, "grants", "add", origin_d, "--tools", "*", "--models", "*",
                       "--budget", "tokens=5").returncode == 0
        done = execute(daily)
        assert done.returncode != 0 and "daily token budget of 5 would be exceeded (0 used" in done.stderr, \
            done.stderr[-3000:]
        # papermill of the same daily notebook is the same origin (the path, not the runner, names it)
        done = papermill(daily)
        assert done.returncode != 0 and "daily token budget of 5" in done.stderr + _outputs(tmp_path / "out.ipynb")

        # and the weekly notebook's budget is untouched by the daily refusals: it runs again
        done = papermill(weekly)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        daemon.stop()

    rows = _audit(tmp_path)
    weekly_rows = [r for r in rows if r["origin"] == origin_w]
    daily_rows = [r for r in rows if r["origin"] == origin_d]
    assert sum(1 for r in weekly_rows if r["tool"].startswith("model:") and r["decision"] == "allow") >= 2, weekly_rows
    assert not any(r["decision"] == "allow" and r["tool"].startswith("model:") for r in daily_rows), daily_rows
    assert sum(1 for r in daily_rows if r["code"] == "BUDGET_EXCEEDED") >= 2, daily_rows
    assert not any(r["origin"].startswith("daemon:kernel:anon-") for r in rows), "a runner's notebook went unnamed"
