"""Tool-call ids the backend reuses (llama.cpp sends ``call_0`` every turn) or leaves empty are made
unique per conversation where the runtime records the call, so every result reaches the model."""

from __future__ import annotations

import pytest

from relay_jupyter.protocol.names import EventType
from relay_jupyter.runtime.context import OUTCOME_UNKNOWN, prepare
from relay_jupyter.testing import Reply, text, tool_use

from .rig import make_rig, tool_results


@pytest.mark.asyncio
async def test_reused_id_across_turns_reaches_the_model_both_times(fake, backend_name):
    rig = make_rig(backend_name, fake)
    rig.tools.notes = "first"
    fake.enqueue(Reply(tool_use("read_note", {}, id="call_0")),
                 Reply(tool_use("read_note", {}, id="call_0")),
                 Reply("Both read."))
    run_id, terminal = await rig.run()
    assert terminal == EventType.DONE
    assert len(fake.requests) == 3  # not asked again and again
    assert rig.tools.reads == 2
    second = tool_results(fake.requests[1].body)
    third = tool_results(fake.requests[2].body)
    assert len(second) == 1 and len(third) == 2
    ids = [r[0] for r in third]
    assert len(set(ids)) == 2, ids  # two distinct ids on the wire
    assert all("first" in r[1] and OUTCOME_UNKNOWN not in r[1] for r in third)
    assert rig.journal.calls_without_outcome(run_id) == []
    started = [d["call_id"] for d in rig.events.of(EventType.TOOL_STARTED, run_id)]
    assert len(set(started)) == 2


@pytest.mark.asyncio
async def test_reused_id_across_runs_of_one_conversation(fake, backend_name):
    rig = make_rig(backend_name, fake)
    fake.enqueue(Reply(tool_use("read_note", {}, id="call_0")), Reply("one"))
    assert (await rig.run("first"))[1] == EventType.DONE
    fake.enqueue(Reply(tool_use("read_note", {}, id="call_0")), Reply("two"))
    assert (await rig.run("second"))[1] == EventType.DONE
    results = tool_results(fake.requests[3].body)
    assert len(results) == 2 and len({r[0] for r in results}) == 2
    assert all("note contents" in r[1] for r in results)


@pytest.mark.asyncio
async def test_same_id_twice_in_one_turn_and_empty_ids(fake, backend_name):
    rig = make_rig(backend_name, fake)
    fake.enqueue(Reply(text("two reads"), tool_use("read_note", {}, id="dup"), tool_use("read_note", {}, id="dup")),
                 Reply("done"))
    _, terminal = await rig.run()
    assert terminal == EventType.DONE
    assert rig.tools.reads == 2
    results = tool_results(fake.requests[1].body)
    assert len(results) == 2 and len({r[0] for r in results}) == 2
    assert all("note contents" in r[1] for r in results)


def test_prepare_pairs_a_legacy_history_with_reused_ids():
    """Conversations stored before the fix hold ``call_0`` twice: each call still gets its own result."""
    def call(turn):
        return {"role": "assistant", "turn": turn,
                "content": [{"type": "tool_use", "id": "call_0", "name": "read_note", "input": {}}]}

    def result(turn, body):
        return {"role": "user", "turn": turn,
                "content": [{"type": "tool_result", "tool_use_id": "call_0", "is_error": False, "content": body}]}

    history = [{"role": "user", "content": [{"type": "text", "text": "go"}], "turn": 0},
               call(0), result(0, "A"), call(0), result(0, "B")]
    msgs = prepare(history)
    uses = [b["id"] for m in msgs if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    answers = [(b["tool_use_id"], b["content"]) for m in msgs if m["role"] == "user"
               for b in m["content"] if b.get("type") == "tool_result"]
    assert len(set(uses)) == 2
    assert answers == [(uses[0], "A"), (uses[1], "B")]
    assert history[3]["content"][0]["id"] == "call_0"  # the stored history is not modified


def test_call_ids_keep_new_ids_and_replace_empty_malformed_and_used_ones():
    from relay_jupyter.backends.base import ToolCallDone
    from relay_jupyter.runtime.call_ids import CallIds, history_ids

    used = history_ids([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "orphan"}]},
                        {"role": "user", "content": "plain text"}])
    assert used == {"a", "orphan"}
    ids = CallIds(used)
    keep = ToolCallDone("toolu_01AbC-x", "t", {})
    assert ids.claim(keep) is keep
    out = [ids.claim(ToolCallDone(cid, "t", {"k": 1})).id for cid in ("a", "orphan", "", "bad id/..", "toolu_01AbC-x")]
    assert len(set(out)) == 5 and all(o.startswith("relay_") for o in out)
    again = ids.claim(ToolCallDone("x" * 500, "t", {}))
    assert again.id.startswith("relay_") and again.input == {}
