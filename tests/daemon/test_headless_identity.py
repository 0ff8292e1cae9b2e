"""Each headless notebook is its own origin (issue 19 item 4): nbclient does not tell a kernel which notebook it
runs, so before, every headless notebook on one daemon was ``daemon:kernel`` — a grant made by one notebook let
a different notebook, which never connected, run green, and budgets were shared. Now such a kernel gets a fresh
origin (and says so in one line), and ``RELAY_NOTEBOOK`` names a notebook for runners that know its path.

Real parts: ``jupyter relay serve`` on a Unix socket (demo backend), nbclient running two real notebooks."""

from __future__ import annotations

import os

import nbformat
import pytest
from daemon_harness import run_cli, start_daemon
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

pytestmark = pytest.mark.slow


def _notebook(*cells: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _run(nb: nbformat.NotebookNode, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    for key in [k for k in os.environ if k.startswith(("RELAY_", "JPY_"))]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # nbclient's kernel inherits this process's environment
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return ["".join(o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", "")
                    for o in c.outputs) for c in nb.cells]


def test_a_grant_of_one_headless_notebook_does_not_let_another_run(tmp_path, monkeypatch):
    daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/s/relay.sock")
    try:
        env = {"RELAY_URL": daemon.address, "JUPYTER_DATA_DIR": str(tmp_path / "data"),
               "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "CI": "1"}
        first = _notebook("%load_ext relay_jupyter",
                          "g = relay.connect([], models=['*'])\nprint('origin', g['origin'])",
                          "%%agent\nhello")
        outs = _run(first, env, monkeypatch)
        origin = outs[1].split()[-1]
        assert origin.startswith("daemon:kernel:anon-"), outs
        assert "[demo]" in outs[2], outs  # it ran, with its own grant

        second = _notebook("%load_ext relay_jupyter", "%%agent\nhello")
        with pytest.raises(CellExecutionError) as err:
            _run(second, env, monkeypatch)
        text = str(err.value)
        assert "UNAUTHORIZED" in text or "no relay grant" in text, text
        assert "does not know its notebook's path" in "".join(
            o.get("text", "") for c in second.cells for o in c.outputs if o.get("output_type") == "stream")

        # a runner that knows the path names it; a terminal grant for that name then applies
        assert run_cli(tmp_path, "grants", "add", "daemon:kernel:reports_daily.ipynb", "--tools", "list_variables",
                       "--models", "*").returncode == 0
        named = _notebook("%load_ext relay_jupyter", "%%agent\nhello")
        outs = _run(named, {**env, "RELAY_NOTEBOOK": "reports/daily.ipynb"}, monkeypatch)
        assert "does not know" not in "".join(outs) and "[demo]" in outs[1], outs
    finally:
        daemon.stop()
