"""The first model request of a run is made ready in ``run.start``'s one store call (issue 18: one thread hop
instead of seven before the model is asked; ``RelayLoopEngine.prepare``, docs/runtime.md "What runs off the
loop"). What must still hold, checked on the real runtime with both real backends and fake servers:

- when the model request's hold is taken, the run's journal row exists and the prompt is stored (a crash from
  then on is repaired, and the prompt is not lost);
- the events keep their order (``run.started``, ``run.turn``, ``run.step``, ...), exactly one terminal event;
- a run cancelled at once, while that work may still be running on its store thread, ends ``run.cancelled``
  once, after ``run.turn``, and its hold is released (nothing left reserved, nothing sent);
- a refusal of that work (no grant) ends the run with its code, once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from relay_jupyter.protocol.names import TERMINAL_EVENTS

from .rig import ORIGIN, make_rig

pytestmark = pytest.mark.asyncio


def _reserved(rig) -> tuple[int, float]:
    usage = rig.manager.gate.ledger.usage(ORIGIN, rig.book.get(ORIGIN))
    return usage["reserved_tokens"], usage["reserved_cost_usd"]


async def test_the_journal_row_and_the_prompt_are_stored_before_the_hold_is_taken(fake, backend_name):
    rig = make_rig(backend_name, fake)
    gate = rig.manager.gate
    seen: list[dict[str, Any]] = []
    begin = gate.begin_completion

    def checked(origin: str, model: str, **kw: Any) -> Any:
        runs = rig.journal.list_runs(origin=ORIGIN)
        seen.append({"runs": [(r["run_id"], r["state"]) for r in runs], "history": rig.history(),
                     "loop": _has_loop()})
        return begin(origin, model, **kw)

    gate.begin_completion = checked
    run_id, terminal = await rig.run("the prompt to keep")
    assert terminal == "run.done"
    assert len(seen) == 1
    assert seen[0]["runs"] == [(run_id, "running")]
    assert [m["role"] for m in seen[0]["history"]] == ["user"]
    assert "the prompt to keep" in str(seen[0]["history"][0]["content"])
    assert seen[0]["loop"] is False  # on a store thread, not the event loop
    types = rig.events.types(run_id)
    assert types[:3] == ["run.started", "run.turn", "run.step"]
    assert sum(t in TERMINAL_EVENTS for t in types) == 1
    assert _reserved(rig) == (0, 0.0)


async def test_a_run_cancelled_at_once_releases_its_first_hold_and_ends_once(fake, backend_name):
    rig = make_rig(backend_name, fake)
    for i in range(5):  # the cancel lands before, during or after the first request's store work
        conv = f"conv-cancel-{i}"
        run_id = await rig.manager.start(rig.ctx(conv), rig.params("go"))
        if i:
            await asyncio.sleep(0.002 * i)
        rig.manager.cancel(run_id)
        terminal = await rig.events.terminal(run_id)
        types = rig.events.types(run_id)
        assert sum(t in TERMINAL_EVENTS for t in types) == 1, types
        assert types[0] == "run.started"
        if terminal == "run.cancelled":
            assert "run.turn" in types and types.index("run.turn") < types.index("run.cancelled")
        assert _reserved(rig) == (0, 0.0), (i, types)
        assert rig.journal.get_run(run_id)["state"] == terminal.removeprefix("run.")
        assert [m["role"] for m in rig.history(conv)][:1] == ["user"]  # the prompt is kept
    assert rig.manager.active_runs() == []


async def test_no_grant_ends_the_run_unauthorized_once(fake, backend_name):
    rig = make_rig(backend_name, fake)
    rig.book.revoke(ORIGIN)
    run_id, terminal = await rig.run("go")
    assert terminal == "run.error"
    assert rig.events.of("run.error", run_id)[0]["code"] == "UNAUTHORIZED"
    assert sum(t in TERMINAL_EVENTS for t in rig.events.types(run_id)) == 1
    assert fake.requests == []  # nothing was sent
    assert [m["role"] for m in rig.history()] == ["user"]


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def test_another_notebooks_conversation_is_not_found_and_nothing_is_journalled(fake, backend_name):
    """The owner check runs in run.start's one store call, before the journal row (moved from the RPC handler)."""
    from relay_jupyter.core.errors import Code, RoutingRefusal

    rig = make_rig(backend_name, fake)
    rig.conversations.save_conversation("conv-theirs", "notebook:other.ipynb", "theirs",
                                        [{"role": "user", "content": "secret", "turn": 0}], {})
    with pytest.raises(RoutingRefusal) as info:
        await rig.manager.start(rig.ctx("conv-theirs"), rig.params("go"))
    assert info.value.code is Code.NOT_FOUND and "secret" not in info.value.message
    assert rig.journal.list_runs() == [] and rig.manager.active_runs() == [] and not rig.manager.busy("conv-theirs")
    assert fake.requests == [] and rig.events.events == []
    # the notebook's own conversation of that name still runs
    run_id, terminal = await rig.run("go")
    assert terminal == "run.done"


async def test_a_tool_source_failing_at_start_ends_the_run_once_and_frees_the_conversation(fake, backend_name):
    """The first request's tool list is read when run.start readies it: a source that raises there ends the run
    with one run.error (INTERNAL: a bug of that source), and the conversation is not left busy."""

    class Broken:
        def tool_specs(self, ctx):
            raise RuntimeError("this source is broken")

    rig = make_rig(backend_name, fake)
    rig.manager.providers = [Broken(), *rig.manager.providers]
    run_id, terminal = await rig.run("go")
    assert terminal == "run.error"
    assert rig.events.of("run.error", run_id)[0]["code"] == "INTERNAL"
    assert sum(t in TERMINAL_EVENTS for t in rig.events.types(run_id)) == 1
    assert fake.requests == [] and not rig.manager.busy("conv-1")
    assert rig.journal.get_run(run_id)["state"] == "error"
