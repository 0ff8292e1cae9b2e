"""Crash repair: a journal with an intent and no outcome -> interrupted + "outcome unknown", never re-run."""

from __future__ import annotations

import pytest

from relay_jupyter.core.memory import MemoryRunJournal
from relay_jupyter.protocol.names import EventType
from relay_jupyter.runtime.context import OUTCOME_UNKNOWN, prepare, user_message
from relay_jupyter.runtime.conversations import MemoryConversations
from relay_jupyter.runtime.manager import RunManager
from relay_jupyter.storage.sqlite import Store

from .rig import ORIGIN, Recorder, Tools, make_gate


def crashed(journal, conversations) -> None:
    """State as a broker SIGKILLed in the middle of call w1 leaves it (w2 never started)."""
    journal.run_started("run_1", ORIGIN, "conv-1", {"model": "m"})
    history = [user_message("write two files", turn=0),
               {"role": "assistant", "turn": 0, "content": [
                   {"type": "tool_use", "id": "w1", "name": "write_file", "input": {"path": "a", "content": "x"}},
                   {"type": "tool_use", "id": "w2", "name": "write_file", "input": {"path": "b", "content": "y"}}]}]
    conversations.save_conversation("conv-1", ORIGIN, "c", history, {})
    journal.call_intent("run_1", "w1", "write_file", {"path": "a"})


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_recover_marks_interrupted_and_answers_outcome_unknown(kind, tmp_path):
    if kind == "sqlite":
        store = Store.open(tmp_path / "relay.db")
        journal = conversations = store
    else:
        journal, conversations = MemoryRunJournal(), MemoryConversations()
    crashed(journal, conversations)
    events, tools = Recorder(), Tools()
    gate, _, _ = make_gate()
    manager = RunManager(gate, journal, conversations, events, [tools.provider()], {})
    assert manager.recover() == ["run_1"]
    assert journal.unfinished_runs() == []
    assert journal.list_runs()[0]["state"] == "interrupted"
    assert journal.calls_without_outcome("run_1") == []
    (event,) = events.of(EventType.INTERRUPTED)
    assert event["run_id"] == "run_1" and event["outcome_unknown"] == ["w1"]
    messages = conversations.load_conversation("conv-1")["messages"]
    answers = {b["tool_use_id"]: b for b in messages[-1]["content"]}
    assert OUTCOME_UNKNOWN in answers["w1"]["content"] and answers["w1"]["is_error"]
    assert "not run" in answers["w2"]["content"]
    assert tools.written == []  # never re-executed
    # the next request is well-formed: every call answered, in order
    out = prepare(messages)
    assert [b["tool_use_id"] for b in out[-1]["content"]] == ["w1", "w2"]
    assert manager.recover() == []  # idempotent
    if kind == "sqlite":
        store.close()
