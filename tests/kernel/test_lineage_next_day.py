"""Lineage "on another day" (issue 13 item 4): a saved notebook reopened in a NEW kernel of a NEW Jupyter server
process (the one before stopped, the broker's store on disk kept) re-runs cell 2 of 3 and forks at that cell's turn:
the model request holds turn 1 and its answer and the re-run prompt (3 messages, not the 7 of appending to all
three turns), the next cell continues after it (5), and the answers' provenance says turn 1 / turn 2.

Real parts: two Jupyter server processes with the relay extension one after the other on one data dir (SQLite
store, audit log), kernels started by each server, FakeAnthropic as the model (its recorded requests are the
history the model saw). What makes it work is the broker's own store (the turns' cell ids on the conversation's
messages, docs/provenance.md "Lineage"): nothing of the first kernel or server survives but the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text

from .conftest import execute, text_of
from .real_server import RealServer
from .test_provenance import _as_notebook, _provenance_outputs

pytestmark = pytest.mark.slow

MODEL = "claude-fake-1"
NOTEBOOK = "analysis.ipynb"
SETUP = ("%load_ext relay_jupyter\n"
         "%config AgentMagics.consent_ui = 'headless'\n"
         "g = relay.connect(['list_variables'], models=['*'])")
CELLS = (("cell-1", "what is in the data?"), ("cell-2", "which column has gaps?"), ("cell-3", "what next?"))


def _roles(fake: FakeAnthropic) -> list[str]:
    body = fake.requests[-1].body
    return [m["role"] for m in (body["messages"] if isinstance(body, dict) else [])]


def _lineage(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    (record,) = [o["metadata"]["relay"]["provenance"] for o in _provenance_outputs(msgs)]
    return record["lineage"]


def test_a_saved_notebook_reopened_in_a_new_server_and_kernel_forks_at_the_rerun_cell(tmp_path: Path) -> None:
    with FakeAnthropic(api_key="test-key") as fake:
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "default_model": MODEL,
                  "in_memory": False, "data_dir": str(tmp_path / "relay-data")}
        # day 1: three %%agent cells, the notebook saved as JupyterLab saves it, the server stopped
        with RealServer(tmp_path, config) as srv:
            kc = srv.kernel_for(NOTEBOOK)
            reply, msgs = execute(kc, SETUP)
            assert reply["status"] == "ok", text_of(msgs)
            ran = []
            for cell_id, prompt in CELLS:
                fake.enqueue(Reply(text(f"day-1 answer to {prompt}")))
                source = f"%%agent --model {MODEL}\n{prompt}"
                reply, msgs = execute(kc, source, timeout=90, cell_id=cell_id)
                assert reply["status"] == "ok", text_of(msgs)
                ran.append((cell_id, source, msgs))
            assert _roles(fake) == ["user", "assistant", "user", "assistant", "user"]
            (srv.root / NOTEBOOK).write_text(json.dumps(_as_notebook(ran)))
            first_pid = srv.proc.pid
        assert srv.proc.poll() is not None  # the first server (and its broker) is gone
        # day 2: a new server process on the same data dir and root, a new kernel for the reopened notebook
        with RealServer(tmp_path, config) as srv:
            assert srv.proc.pid != first_pid
            kc = srv.kernel_for(NOTEBOOK)
            reply, msgs = execute(kc, "%load_ext relay_jupyter\n%config AgentMagics.consent_ui = 'headless'\n"
                                      "print(len(relay.provenance()))")
            assert reply["status"] == "ok", text_of(msgs)
            assert text_of(msgs).strip().endswith("3")  # the saved answers are there to read
            fake.enqueue(Reply(text("day-2 answer to cell 2")), Reply(text("day-2 answer to cell 3")))
            reply, msgs = execute(kc, f"%%agent --model {MODEL}\nwhich column has gaps, today?", timeout=90,
                                  cell_id="cell-2")
            assert reply["status"] == "ok", text_of(msgs)
            assert "day-2 answer to cell 2" in text_of(msgs)
            # forked at turn 1: turn 0 and its answer, then the re-run prompt (appending would send 7 messages)
            assert _roles(fake) == ["user", "assistant", "user"], fake.requests[-1].body
            sent = json.dumps(fake.requests[-1].body["messages"])
            assert "what is in the data?" in sent and "day-1 answer to what is in the data?" in sent
            assert "which column has gaps, today?" in sent and "day-1 answer to which column" not in sent
            assert _lineage(msgs) == {"conversation": "default", "turn": 1, "parent_cells": ["cell-1"]}
            # the next cell continues after the re-run turn (the old turn 3 went with the fork)
            reply, msgs = execute(kc, f"%%agent --model {MODEL}\nwhat next?", timeout=90, cell_id="cell-3")
            assert reply["status"] == "ok", text_of(msgs)
            assert _roles(fake) == ["user", "assistant", "user", "assistant", "user"]
            assert "day-2 answer to cell 2" in json.dumps(fake.requests[-1].body["messages"])
            assert _lineage(msgs) == {"conversation": "default", "turn": 2, "parent_cells": ["cell-1", "cell-2"]}
