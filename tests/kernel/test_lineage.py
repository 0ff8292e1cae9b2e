"""Lineage by cell id (issue 13 item 4, the kernel's part): each answer's provenance records its turn and the
cell ids of the turns before it, so after a kernel restart re-running a cell of the saved notebook forks at
that cell instead of appending: the model request's history is that of the turn, not of everything run before.

A real Jupyter server with the relay extension (its broker on disk), FakeAnthropic as the model (its recorded
requests give the history length), a kernel started by the server and restarted through the server's API; for
"another day" the server process itself is stopped and a new one started on the same data dir."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text

from .conftest import execute, text_of
from .real_server import RealServer
from .test_provenance import _as_notebook, _provenance_outputs

pytestmark = pytest.mark.slow

MODEL = "claude-fake-1"
SETUP = ("%load_ext relay_jupyter\n"
         "%config AgentMagics.consent_ui = 'headless'\n"
         "g = relay.connect(['list_variables'], models=['*'])")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic]]:
    with FakeAnthropic(api_key="test-key") as fake:
        tmp = tmp_path_factory.mktemp("lineage")
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "default_model": MODEL,
                  "in_memory": False, "data_dir": str(tmp / "relay-data")}
        with RealServer(tmp, config) as srv:
            yield srv, fake


def _messages(fake: FakeAnthropic) -> list[dict[str, Any]]:
    body = fake.requests[-1].body
    return body["messages"] if isinstance(body, dict) else []


def _restart(srv: RealServer, kc: Any) -> None:
    (session,) = [s for s in srv.api("GET", "api/sessions") if s["path"] == "lineage.ipynb"]
    srv.api("POST", f"api/kernels/{session['kernel']['id']}/restart", {})
    deadline = time.monotonic() + 60
    while True:  # the client keeps its channels: the restarted kernel listens on the same ports
        try:
            kc.wait_for_ready(timeout=10)
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise


def test_rerun_after_a_restart_forks_at_the_cell(lab: tuple[RealServer, FakeAnthropic]) -> None:
    srv, fake = lab
    kc = srv.kernel_for("lineage.ipynb")
    reply, msgs = execute(kc, SETUP)
    assert reply["status"] == "ok", text_of(msgs)
    cells = []
    for cell_id, prompt in (("cell-a", "first question"), ("cell-b", "second question")):
        fake.enqueue(Reply(text(f"answer to {prompt}")))
        source = f"%%agent --model {MODEL}\n{prompt}"
        reply, msgs = execute(kc, source, timeout=60, cell_id=cell_id)
        assert reply["status"] == "ok", text_of(msgs)
        cells.append((cell_id, source, msgs))
    assert len(_messages(fake)) == 3  # a, its answer, b
    (record,) = [o["metadata"]["relay"]["provenance"] for o in _provenance_outputs(cells[1][2])]
    assert record["lineage"] == {"conversation": "default", "turn": 1, "parent_cells": ["cell-a"]}
    assert record["cell_id"] == "cell-b"
    # what JupyterLab saves, then Restart & Run All
    (srv.root / "lineage.ipynb").write_text(json.dumps(_as_notebook(cells)))
    _restart(srv, kc)
    reply, msgs = execute(kc, SETUP)
    assert reply["status"] == "ok", text_of(msgs)
    fake.enqueue(Reply(text("a again")), Reply(text("b again")))
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nfirst question", timeout=60, cell_id="cell-a")
    assert reply["status"] == "ok", text_of(msgs)
    # forked at cell-a's turn: the model sees that turn alone (it saw 5 messages when the restart forgot it)
    assert [m["role"] for m in _messages(fake)] == ["user"], _messages(fake)
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nsecond question", timeout=60, cell_id="cell-b")
    assert reply["status"] == "ok", text_of(msgs)
    assert [m["role"] for m in _messages(fake)] == ["user", "assistant", "user"]  # the same shape as before
    (record,) = [o["metadata"]["relay"]["provenance"] for o in _provenance_outputs(msgs)]
    assert record["lineage"] == {"conversation": "default", "turn": 1, "parent_cells": ["cell-a"]}


def test_rerun_after_a_restart_of_an_unsaved_notebook_forks_at_the_cell(
        lab: tuple[RealServer, FakeAnthropic]) -> None:
    # the broker keys each turn by the cell id run.start sent: after a kernel restart, re-running cell 2 of 3
    # of a notebook never saved (nothing in the file to rebuild from) forks at cell 2's turn
    srv, fake = lab
    kc = srv.kernel_for("unsaved.ipynb")
    assert not (srv.root / "unsaved.ipynb").exists()
    reply, msgs = execute(kc, SETUP)
    assert reply["status"] == "ok", text_of(msgs)
    for cell_id in ("u-1", "u-2", "u-3"):
        fake.enqueue(Reply(text(f"answer {cell_id}")))
        reply, msgs = execute(kc, f"%%agent --model {MODEL}\nquestion {cell_id}", timeout=60, cell_id=cell_id)
        assert reply["status"] == "ok", text_of(msgs)
    assert len(_messages(fake)) == 5  # turn 3 saw turns 1 and 2
    (session,) = [s for s in srv.api("GET", "api/sessions") if s["path"] == "unsaved.ipynb"]
    srv.api("POST", f"api/kernels/{session['kernel']['id']}/restart", {})
    deadline = time.monotonic() + 60
    while True:
        try:
            kc.wait_for_ready(timeout=10)
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
    reply, msgs = execute(kc, SETUP)
    assert reply["status"] == "ok", text_of(msgs)
    fake.enqueue(Reply(text("answer u-2 again")), Reply(text("answer u-3 again")))
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nquestion u-2 again", timeout=60, cell_id="u-2")
    assert reply["status"] == "ok", text_of(msgs)
    # the request of turn 2: turn 1 and its answer, then the re-run prompt (5 before the fix: everything appended)
    sent = _messages(fake)
    assert [m["role"] for m in sent] == ["user", "assistant", "user"], sent
    assert "question u-1" in json.dumps(sent[0]) and "question u-2 again" in json.dumps(sent[2])
    assert "cell_id" not in json.dumps(sent)  # stored with the turn, never sent to the model
    (record,) = [o["metadata"]["relay"]["provenance"] for o in _provenance_outputs(msgs)]
    assert record["lineage"] == {"conversation": "default", "turn": 1, "parent_cells": ["u-1"]}
    # the next cell continues after the re-run turn (its old turn 3 was dropped with the fork)
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nquestion u-3", timeout=60, cell_id="u-3")
    assert reply["status"] == "ok", text_of(msgs)
    assert [m["role"] for m in _messages(fake)] == ["user", "assistant", "user", "assistant", "user"]
    (record,) = [o["metadata"]["relay"]["provenance"] for o in _provenance_outputs(msgs)]
    assert record["lineage"] == {"conversation": "default", "turn": 2, "parent_cells": ["u-1", "u-2"]}
    # a cell id that is not nbformat's (VS Code sends the cell's URI) still names its cell: hashed, not refused
    fake.enqueue(Reply(text("vs code 1")), Reply(text("vs code 2")))
    uri = "vscode-notebook-cell:/home/u/unsaved.ipynb#W3sZmlsZQ=="
    for _ in range(2):
        reply, msgs = execute(kc, f"%%agent --model {MODEL} --chat vsc\nfrom vs code", timeout=60, cell_id=uri)
        assert reply["status"] == "ok", text_of(msgs)
        assert [m["role"] for m in _messages(fake)] == ["user"]  # the second run replaced the first's turn


def test_turns_saved_against_another_broker_start_afresh(lab: tuple[RealServer, FakeAnthropic]) -> None:
    # a saved notebook whose conversation this broker never had (another day, another broker): the re-run cell
    # starts the conversation instead of failing on the fork
    srv, fake = lab
    record = {"version": 1, "run_id": "run_old", "conversation": "gone-conversation", "chat": "default",
              "cell_id": "cell-z", "started_at": 1.0,
              "lineage": {"conversation": "gone-conversation", "turn": 2, "parent_cells": ["cell-x", "cell-y"]},
              "tool_calls": [], "checkpoints": []}
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"id": "cell-z", "cell_type": "code", "source": "%%agent\nold", "metadata": {}, "execution_count": 1,
         "outputs": [{"output_type": "display_data", "data": {"text/plain": "old"},
                      "metadata": {"relay": {"provenance": record}}}]}]}
    (srv.root / "other.ipynb").write_text(json.dumps(nb))
    kc = srv.kernel_for("other.ipynb")
    reply, msgs = execute(kc, SETUP)
    assert reply["status"] == "ok", text_of(msgs)
    fake.enqueue(Reply(text("fresh start")))
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nold", timeout=60, cell_id="cell-z")
    assert reply["status"] == "ok", text_of(msgs)
    assert "fresh start" in text_of(msgs)
    assert [m["role"] for m in _messages(fake)] == ["user"]
    (saved,) = [o["metadata"]["relay"]["provenance"] for o in _provenance_outputs(msgs)]
    assert saved["lineage"] == {"conversation": "gone-conversation", "turn": 0, "parent_cells": []}


def _roles(fake: FakeAnthropic) -> list[str]:
    return [m["role"] for m in _messages(fake)]


def _lineage(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    (record,) = [o["metadata"]["relay"]["provenance"] for o in _provenance_outputs(msgs)]
    return record["lineage"]


def test_a_saved_notebook_reopened_in_a_new_server_and_kernel_forks_at_the_rerun_cell(
        lab: tuple[RealServer, FakeAnthropic]) -> None:
    # "another day" (issue 13 item 4): three cells run, the notebook saved, the Jupyter server process stopped; a
    # NEW server process on the same data dir and a NEW kernel for the reopened notebook re-run cell 2 of 3: it
    # forks at that cell's turn (the broker's store keeps each turn's cell id; nothing else survives but files)
    srv, fake = lab
    kc = srv.kernel_for("analysis.ipynb")
    reply, msgs = execute(kc, SETUP)
    assert reply["status"] == "ok", text_of(msgs)
    ran = []
    for cell_id, prompt in (("day-1", "what is in the data?"), ("day-2", "which column has gaps?"),
                            ("day-3", "what next?")):
        fake.enqueue(Reply(text(f"day-1 answer to {prompt}")))
        source = f"%%agent --model {MODEL}\n{prompt}"
        reply, msgs = execute(kc, source, timeout=90, cell_id=cell_id)
        assert reply["status"] == "ok", text_of(msgs)
        ran.append((cell_id, source, msgs))
    assert _roles(fake) == ["user", "assistant", "user", "assistant", "user"]
    (srv.root / "analysis.ipynb").write_text(json.dumps(_as_notebook(ran)))
    before = srv.proc.pid
    srv.restart()
    assert srv.proc.pid != before
    kc = srv.kernel_for("analysis.ipynb")
    reply, msgs = execute(kc, "%load_ext relay_jupyter\n%config AgentMagics.consent_ui = 'headless'\n"
                              "print(len(relay.provenance()))")
    assert reply["status"] == "ok", text_of(msgs)
    assert text_of(msgs).strip().endswith("3")  # the saved answers are there to read
    fake.enqueue(Reply(text("day-2 answer to cell 2")), Reply(text("day-2 answer to cell 3")))
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nwhich column has gaps, today?", timeout=90,
                          cell_id="day-2")
    assert reply["status"] == "ok", text_of(msgs)
    assert "day-2 answer to cell 2" in text_of(msgs)
    # forked at turn 1: turn 0 and its answer, then the re-run prompt (appending would send 7 messages; a broker
    # that forgot the conversation would send 1)
    assert _roles(fake) == ["user", "assistant", "user"], _messages(fake)
    sent = json.dumps(_messages(fake))
    assert "what is in the data?" in sent and "day-1 answer to what is in the data?" in sent
    assert "which column has gaps, today?" in sent and "day-1 answer to which column" not in sent
    assert _lineage(msgs) == {"conversation": "default", "turn": 1, "parent_cells": ["day-1"]}
    # the next cell continues after the re-run turn (the old turn 3 went with the fork)
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nwhat next?", timeout=90, cell_id="day-3")
    assert reply["status"] == "ok", text_of(msgs)
    assert _roles(fake) == ["user", "assistant", "user", "assistant", "user"]
    assert "day-2 answer to cell 2" in json.dumps(_messages(fake))
    assert _lineage(msgs) == {"conversation": "default", "turn": 2, "parent_cells": ["day-1", "day-2"]}


def test_restore_takes_the_newest_well_formed_record_of_the_chat() -> None:
    from relay_jupyter.kernel.conversations import ConversationBook, restore_chat

    def rec(chat: str, cell: Any, turn: Any, parents: Any, when: float, conversation: Any = "default") -> dict:
        return {"chat": chat, "cell_id": cell, "started_at": when,
                "lineage": {"conversation": conversation, "turn": turn, "parent_cells": parents}}

    records = [rec("default", "a", 0, [], 1.0), rec("default", "c", 2, ["a", "b"], 3.0),
               rec("default", "b", 1, ["a"], 2.0), rec("other", "x", 0, [], 9.0, "other")]
    chat = restore_chat("default", records)
    assert chat is not None and chat.conversation == "default" and chat.turns == ["a", "b", "c"]
    assert ConversationBook.fork_point(chat, "b") == 1
    for bad in (rec("default", "z", 3, ["a"], 9.0),            # turn and parents disagree
                rec("default", "z", True, [], 9.0),            # a bool is not a turn
                rec("default", "z", 1, [7], 9.0),              # a parent that is not a cell id
                rec("default", "z", 0, [], 9.0, ""),           # no conversation
                {"chat": "default", "cell_id": "z", "started_at": 9.0}):  # a record from before lineage
        assert restore_chat("default", [*records, bad]).turns == ["a", "b", "c"], bad
    assert restore_chat("default", []) is None and restore_chat("nope", records) is None
    # the book asks the saved notebook only for a chat it has not used yet, and never for --new
    calls: list[int] = []
    book = ConversationBook(saved=lambda: calls.append(1) or records)
    assert book.chat("default").turns == ["a", "b", "c"] and calls == [1]
    book.chat("default")
    assert calls == [1]
    assert book.chat("default", new=True).turns == [] and calls == [1]
