"""The claude-code engine keeps relay's run semantics (issue 17 item 3): the modes ask / review / full decide a
write of Claude Code exactly as for the built-in loop, the step cap and the budgets end the run with one
``run.budget_exhausted`` before the refused request reaches the model server.

The REAL bundled ``claude`` CLI against ``FakeAnthropic``, reached only through relay's Anthropic endpoint;
``peer``, only inside ``unshare -n`` (``make test-claude-code``).
"""

from __future__ import annotations

import json

import pytest

from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import Reply, text, tool_use

from .claude_code_rig import (KEY, MODEL, NB, ONLY_ISOLATED, answer, close, events, fake, open_request,
                              result_text, terminal, terminal_data, tool_results, workspace)

pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.asyncio, ONLY_ISOLATED]


def _broker(tmp_path, fake, *, budget: Budget | None = None, max_steps: int | None = None) -> Broker:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    extra = {"runtime": {"max_steps": max_steps}} if max_steps is not None else {}
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=30, anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL,
                                      default_engine="claude-code", extra=extra))
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                              budget=budget or Budget(), consent_id="t"))
    install_components(broker, jupyter_root=root)
    return broker


def _bash(marker) -> dict:
    return {"command": f"echo ran > {marker}", "description": "write a marker"}


async def test_full_mode_runs_a_bash_command_without_a_card(tmp_path, fake):
    broker = _broker(tmp_path, fake)
    try:
        marker = workspace(broker, "m1") / "full.txt"
        fake.enqueue(Reply(tool_use("Bash", _bash(marker))), Reply("Ran it."))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "m1", "prompt": "run", "mode": "full"}))[
            "run_id"]
        assert await terminal(broker, run_id) == EventType.DONE
        assert not events(broker, run_id, EventType.PERMISSION_REQUEST)  # full mode: no card
        assert marker.read_text().strip() == "ran"
        (decided,) = [e.data for e in events(broker, run_id, EventType.TOOL_DECIDED)]
        assert decided["decision"] == "allow"
        audit = [r for r in broker.audit.tail(1000, origin=NB.origin) if r.tool == "Bash"]
        assert [r.decision for r in audit] == ["allow"] and audit[0].answered_by == "mode:full"
    finally:
        await close(broker)


async def test_review_mode_asks_the_reviewer_and_its_deny_stops_the_command(tmp_path, fake):
    broker = _broker(tmp_path, fake)
    try:
        ws = workspace(broker, "m2")
        allowed, denied = ws / "allowed.txt", ws / "denied.txt"
        # the CLI's request, then the reviewer's (relay's own backend, the same fake), then the CLI's again
        fake.enqueue(Reply(tool_use("Bash", _bash(allowed))),
                     Reply(json.dumps({"verdict": "allow", "reason": "writes inside the workspace"})),
                     Reply("Ran it."))
        run_id = (await call_method(broker, NB, "run.start",
                                    {"conversation": "m2", "prompt": "run", "mode": "review"}))["run_id"]
        assert await terminal(broker, run_id) == EventType.DONE
        assert not events(broker, run_id, EventType.PERMISSION_REQUEST)  # the reviewer answered, not a card
        assert allowed.read_text().strip() == "ran"
        (review,) = [e.data for e in events(broker, run_id, EventType.REVIEW)]
        assert review["verdict"] == "allow"
        reviewer_request = fake.requests[1].body
        assert f"echo ran > {allowed}" in json.dumps(reviewer_request)  # the reviewer saw the exact command

        fake.enqueue(Reply(tool_use("Bash", _bash(denied))),
                     Reply(json.dumps({"verdict": "deny", "reason": "not needed"})),
                     Reply("The reviewer refused."))
        run_id = (await call_method(broker, NB, "run.start",
                                    {"conversation": "m2", "prompt": "again", "mode": "review"}))["run_id"]
        assert await terminal(broker, run_id) == EventType.DONE
        assert not denied.exists()  # nothing ran
        last = tool_results(fake)[-1]
        assert last.get("is_error") and "CONSENT_DENIED" in result_text(last)  # the model read the denial
        audit = [r for r in broker.audit.tail(1000, origin=NB.origin) if r.tool == "Bash"]
        assert [(r.decision, r.answered_by) for r in audit] == [("allow", "mode:review"), ("deny", "mode:review")]
    finally:
        await close(broker)


async def test_ask_mode_card_names_the_run_and_a_contained_write_needs_none(tmp_path, fake):
    broker = _broker(tmp_path, fake)
    try:
        ws = workspace(broker, "m3")
        fake.enqueue(Reply(tool_use("Write", {"file_path": str(ws / "draft.md"), "content": "# draft\n"}),
                           tool_use("Bash", _bash(ws / "asked.txt"))), Reply("Both done."))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "m3", "prompt": "go"}))["run_id"]
        request = await answer(broker, "allow")
        assert request["tool"] == "Bash" and request["run_id"] == run_id  # only the Bash call asked
        assert await terminal(broker, run_id) == EventType.DONE
        assert (ws / "draft.md").read_text() == "# draft\n" and (ws / "asked.txt").exists()
        assert len(events(broker, run_id, EventType.PERMISSION_REQUEST)) == 1
    finally:
        await close(broker)


async def test_the_step_cap_ends_the_run_before_a_further_model_request(tmp_path, fake):
    broker = _broker(tmp_path, fake, max_steps=2)
    try:
        ws = workspace(broker, "s1")
        (ws / "a.txt").write_text("a\n")
        fake.enqueue(*[Reply(tool_use("Read", {"file_path": str(ws / "a.txt")})) for _ in range(4)])
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "s1", "prompt": "loop"}))["run_id"]
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED
        assert "step limit of 2" in terminal_data(broker, run_id)["message"]
        assert len(fake.requests) == 2  # the third request never left
        assert [e.data["step"] for e in events(broker, run_id, EventType.STEP)] == [1, 2]
    finally:
        await close(broker)


async def test_a_grants_step_cap_per_run_binds_the_engine_at_relays_endpoint(tmp_path, fake):
    broker = _broker(tmp_path, fake, budget=Budget(max_steps_per_run=1))
    try:
        ws = workspace(broker, "s2")
        (ws / "a.txt").write_text("a\n")
        fake.enqueue(Reply(tool_use("Read", {"file_path": str(ws / "a.txt")})), Reply("never sent"))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "s2", "prompt": "read"}))["run_id"]
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED
        assert "step limit of 1" in terminal_data(broker, run_id)["message"]
        assert len(fake.requests) == 1  # the second request was refused by the gate before it was forwarded
        denied = [r for r in broker.audit.tail(1000, origin=NB.origin)
                  if r.tool == f"model:{MODEL}" and r.decision == "deny"]
        assert denied and denied[0].code == "BUDGET_EXCEEDED"
    finally:
        await close(broker)


async def test_a_budget_spent_mid_run_ends_it_with_one_budget_exhausted(tmp_path, fake):
    broker = _broker(tmp_path, fake)
    try:
        marker = workspace(broker, "b1") / "after.txt"
        fake.enqueue(Reply(text("One command."), tool_use("Bash", _bash(marker))), Reply("never sent"))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "b1", "prompt": "go"}))["run_id"]
        request = await open_request(broker, run_id)
        # while the card waits, the notebook's day budget is narrowed to what is already used: nothing is left
        used = broker.ledger.usage(NB.origin)["tokens"]
        assert used > 0  # the first request was charged at relay's endpoint
        broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                  budget=Budget(tokens_per_day=used), consent_id="t"))
        await call_method(broker, NB, "permission.answer",
                          {"request_id": request["request_id"], "decision": "allow", "scope": "once"})
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED
        assert marker.read_text().strip() == "ran"  # the approved command ran
        assert len(fake.requests) == 1  # the next request was refused before it was forwarded
        assert broker.ledger.usage(NB.origin)["tokens"] == used  # nothing more was charged
    finally:
        await close(broker)
