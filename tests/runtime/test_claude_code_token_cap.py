"""The claude-code engine honours the grant's ``max_tokens_per_run`` (docs/engines.md): relay's engine endpoint
hands the run's caps to the gate with every model request of the run. The CLI asks ``max_tokens: 32000`` at
every request; relay lowers it to what the run's cap (and the day budgets) still leave after the request's
input, so the reservation fits, and refuses the request (``BUDGET_EXCEEDED``, nothing forwarded) only when not
even a short answer would fit; the run then ends with one ``run.budget_exhausted`` whose message is the
one-line reason. Each request's real charge counts into the run; the cap is per run: the next run starts from
zero. Under the default grant (100,000 tokens per run) a task of several requests completes.

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
from relay_jupyter.testing import Reply, tool_use
from relay_jupyter.testing.script import Usage

from .claude_code_rig import (KEY, MODEL, NB, ONLY_ISOLATED, close, events, fake, terminal, terminal_data,
                              workspace)

pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.asyncio, ONLY_ISOLATED]


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
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED, [
            (r.decision, r.arguments) for r in broker.audit.tail(100, origin=NB.origin) if r.tool == f"model:{MODEL}"]
        message = terminal_data(broker, run_id)["message"]
        assert "token limit of 500 per run reached" in message and "\n" not in message
        assert fake.requests == []  # refused at relay's endpoint: the model server saw nothing
        denied = _model_audit(broker, "deny")
        assert denied and {r.code for r in denied} == {"BUDGET_EXCEEDED"}
        assert _model_audit(broker, "allow") == []
    finally:
        await close(broker)


def _forwarded(fake, since: int) -> list[int]:
    """The ``max_tokens`` of each request the model server received since ``since``."""
    return [r.body["max_tokens"] for r in fake.requests[since:]]


# What Anthropic reports for one of the CLI's requests: its system prompt and tool definitions are about 13,000
# tokens by relay's estimate (characters / 3) and by a real tokenizer alike. The fake would count words (about a
# quarter of that), so each reply reports a real tokenizer's figure.
REAL = Usage(input_tokens=12_000, output_tokens=40)


def _reads(broker: Broker, conversation: str, n: int) -> list[Reply]:
    ws = workspace(broker, conversation)
    script = []
    for i in range(n):
        (ws / f"f{i}.txt").write_text(f"line {i}\n")
        script.append(Reply(tool_use("Read", {"file_path": str(ws / f"f{i}.txt")}), usage=REAL))
    return script


def _fits_the_cap(broker: Broker, since: float, cap: int) -> None:
    """Every forwarded request's reservation fitted in what the run had left; the charges stay under the cap."""
    audit = [r for r in broker.audit.tail(10_000, origin=NB.origin)
             if r.tool == f"model:{MODEL}" and r.ts >= since and r.decision in ("allow", "settled")]
    used = 0
    for record in audit:
        if record.decision == "allow":
            assert used + record.arguments["estimated_tokens"] <= cap, (used, record.arguments)
        else:
            used += record.arguments["tokens"]
    assert used <= cap


async def test_a_small_cap_lowers_max_tokens_until_the_run_is_spent_and_the_next_run_starts_afresh(tmp_path, fake):
    cap = 36_000  # below one request as the CLI asks it (about 13k in + 32k out), above two of its real charges
    broker = _broker(tmp_path, fake, cap=cap)
    try:
        fake.enqueue(*_reads(broker, "c1", 5), Reply("never reached", usage=REAL))
        run_id = await _run(broker, "c1")
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED, [
            (r.decision, r.arguments) for r in broker.audit.tail(100, origin=NB.origin) if r.tool == f"model:{MODEL}"]
        sent = _forwarded(fake, 0)
        # without the fitting, the first request (its 32000 out alone nearly the cap) would have been refused
        assert len(sent) >= 2 and all(1024 <= m < 32_000 for m in sent), sent
        assert sent == sorted(sent, reverse=True)  # each one gets what the run has left
        allowed = _model_audit(broker, "allow")
        assert [r.arguments["max_output_tokens"] for r in allowed] == sent
        assert {r.arguments["max_tokens_asked"] for r in allowed} == {32_000}  # audited as lowered
        _fits_the_cap(broker, 0.0, cap)
        message = terminal_data(broker, run_id)["message"]
        assert f"token limit of {cap} per run reached" in message and "\n" not in message
        assert len(events(broker, run_id, EventType.BUDGET_EXHAUSTED)) == 1
        assert _model_audit(broker, "deny")[-1].code == "BUDGET_EXCEEDED"

        # per run: the next run under the same grant gets its first request through
        fake.script.clear()  # the replies the spent run never asked for
        fake.enqueue(Reply("Done again."))
        before = len(fake.requests)
        run_id = await _run(broker, "c2")
        assert await terminal(broker, run_id) == EventType.DONE, terminal_data(broker, run_id)
        assert len(fake.requests) == before + 1
    finally:
        await close(broker)


async def test_a_task_of_seven_model_requests_completes_under_the_default_grant(tmp_path, fake):
    root = tmp_path / "root"
    root.mkdir()
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=30, anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL,
                                      default_engine="claude-code"))
    # the default budget: 100,000 tokens per run, 200,000 a day, $5 a day, 25 steps
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="t"))
    install_components(broker, jupyter_root=root)
    try:
        fake.enqueue(*_reads(broker, "d1", 6), Reply("Read all six.", usage=REAL))
        run_id = await _run(broker, "d1")
        assert await terminal(broker, run_id) == EventType.DONE, terminal_data(broker, run_id)
        assert len(fake.requests) == 7
        charged = [r.arguments["tokens"] for r in _model_audit(broker, "settled")]
        # as the CLI asks them (13k in + 32k out reserved each), the sixth request would not have fitted after
        # five real charges of 12k: the last requests were lowered to fit, the charges stay under the cap
        assert len(charged) == 7 and min(charged) >= 12_000 and sum(charged) <= 100_000, charged
        sent = _forwarded(fake, 0)
        assert sent[:5] == [32_000] * 5 and all(1024 <= m < 32_000 for m in sent[5:]), sent
        _fits_the_cap(broker, 0.0, 100_000)
        assert "Read all six." in "".join(e.data.get("text", "") for e in events(broker, run_id, EventType.TEXT_DELTA))
    finally:
        await close(broker)


async def test_a_lowered_request_that_stops_at_max_tokens_ends_the_run_once_within_the_cap(tmp_path, fake):
    """The price of fitting: an answer may stop at its lowered ``max_tokens``. The CLI takes that as any long
    answer; the run still ends with exactly one terminal event, and nothing it sent was over the cap."""
    cap = 30_000
    broker = _broker(tmp_path, fake, cap=cap)
    try:
        fake.enqueue(Reply("A long answer cut short", usage=REAL, stop_reason="max_tokens"),
                     *[Reply("Continued.", usage=REAL) for _ in range(3)])
        run_id = await _run(broker, "m1")
        # the bundled CLI asks once more after a max_tokens stop (lowered again to what is left), then ends
        assert await terminal(broker, run_id) == EventType.DONE, terminal_data(broker, run_id)
        sent = _forwarded(fake, 0)
        assert len(sent) >= 2 and sent == sorted(sent, reverse=True) and sent[0] < 32_000, sent
        _fits_the_cap(broker, 0.0, cap)
        shown = "".join(e.data["text"] for e in events(broker, run_id, EventType.TEXT_DELTA))
        assert "A long answer cut short" in shown
    finally:
        await close(broker)
