"""The claude-code engine honours the grant's ``max_tokens_per_run`` (docs/engines.md): relay's engine endpoint
hands the run's caps to the gate with every model request of the run, so each request's reservation is checked
against the tokens the run was charged so far and the request that would pass the cap is refused before it is
forwarded (``BUDGET_EXCEEDED``, as for the built-in loop); the run ends with one ``run.budget_exhausted`` whose
message is the one-line reason. The cap is per run: the next run starts from zero.

The REAL bundled ``claude`` CLI against ``FakeAnthropic``; ``peer``, only inside ``unshare -n``
(``make test-claude-code``).
"""

from __future__ import annotations

import pytest

from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import FakeAnthropic, Reply, tool_use
from relay_jupyter.testing.script import Usage

from .claude_code_rig import KEY, MODEL, NB, ONLY_ISOLATED, close, events, terminal, terminal_data, workspace

pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.asyncio, ONLY_ISOLATED]


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY, default=Reply("(fake) nothing scripted")) as server:
        yield server


def _broker(tmp_path, fake, cap: int | None) -> Broker:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=30, anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL,
                                      default_engine="claude-code"))
    _grant(broker, cap)
    install_components(broker, jupyter_root=root)
    return broker


def _grant(broker: Broker, cap: int | None) -> None:
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                              # day budgets far away: the per-run cap is what this file is about
                              budget=Budget(max_tokens_per_run=cap, tokens_per_day=10**9, cost_per_day_usd=10**4),
                              consent_id="t"))


def _model_audit(broker: Broker, decision: str) -> list:
    return [r for r in broker.audit.tail(10_000, origin=NB.origin)
            if r.tool == f"model:{MODEL}" and r.decision == decision]


async def _run(broker: Broker, conversation: str) -> str:
    return (await call_method(broker, NB, "run.start", {"conversation": conversation, "prompt": "read a.txt",
                                                        "mode": "full"}))["run_id"]


async def test_a_request_whose_reservation_passes_the_cap_is_never_forwarded(tmp_path, fake):
    broker = _broker(tmp_path, fake, cap=500)  # below any request of the CLI (its max_tokens alone is more)
    try:
        run_id = await _run(broker, "c1")
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED
        message = terminal_data(broker, run_id)["message"]
        assert "token limit of 500 per run reached" in message and "\n" not in message
        assert fake.requests == []  # refused at relay's endpoint: the model server saw nothing
        denied = _model_audit(broker, "deny")
        assert denied and {r.code for r in denied} == {"BUDGET_EXCEEDED"}
        assert _model_audit(broker, "allow") == []
    finally:
        await close(broker)


async def test_the_tokens_a_run_was_charged_count_against_its_cap_and_the_next_run_starts_afresh(tmp_path, fake):
    broker = _broker(tmp_path, fake, cap=None)
    try:
        ws_names = ("p1", "r2", "r3")  # names of one length: the CLI's prompts (its cwd) are the same size
        for name in ws_names:
            (workspace(broker, name) / "a.txt").write_text("a\n")

        # a probe run without a cap: the size of the CLI's first request (the reservation the gate makes)
        fake.enqueue(Reply("Nothing to do."))
        run_id = await _run(broker, "p1")
        assert await terminal(broker, run_id) == EventType.DONE
        (probe,) = _model_audit(broker, "allow")
        first = probe.arguments["estimated_tokens"]
        assert first > 500

        # room for one such request, not two: the first is forwarded and reports absurd usage (clamped: the
        # run is charged the whole reservation); the second would pass the cap and is refused
        cap = first + first // 4
        _grant(broker, cap)
        fake.enqueue(Reply(tool_use("Read", {"file_path": str(workspace(broker, "r2") / "a.txt")}),
                           usage=Usage(input_tokens=10**9, output_tokens=10)),
                     Reply("never sent"))
        sent = len(fake.requests)
        run_id = await _run(broker, "r2")
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED
        assert len(fake.requests) == sent + 1  # the second request never left
        settled = [r for r in _model_audit(broker, "settled") if r.ts >= probe.ts][-1]
        charged = settled.arguments["tokens"]
        assert charged > first // 2
        message = terminal_data(broker, run_id)["message"]
        assert f"token limit of {cap} per run reached ({charged} used" in message and "\n" not in message
        assert len(events(broker, run_id, EventType.BUDGET_EXHAUSTED)) == 1
        assert _model_audit(broker, "deny")[-1].code == "BUDGET_EXCEEDED"

        # per run: the next run under the same grant gets its first request through
        fake.enqueue(Reply("Done again."))
        sent = len(fake.requests)
        run_id = await _run(broker, "r3")
        assert await terminal(broker, run_id) == EventType.DONE, terminal_data(broker, run_id)
        assert len(fake.requests) == sent + 1
    finally:
        await close(broker)
