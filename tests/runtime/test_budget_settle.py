"""What a run's model requests are charged, through the real backends and the shipped fake servers:
the reservation covers the whole request, absurd usage is clamped and flagged, a stream without usage
is charged an estimate, a killed or cut request its reservation (docs/gate.md §6)."""

from __future__ import annotations

import asyncio

import pytest

from relay_jupyter.core.types import Budget
from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import FakeOpenAI, Reply, Usage, tool_use
from relay_jupyter.testing.scripted import count_request_tokens

from .rig import KEY, ORIGIN, make_rig

pytestmark = pytest.mark.asyncio


def _model_records(rig, decision: str) -> list:
    return [r for r in rig.audit.records if r.tool.startswith("model:") and r.decision == decision]


def _ledger(rig) -> dict:
    return rig.manager.gate.ledger.usage(ORIGIN)


async def test_the_reservation_covers_tools_and_history(fake, backend_name):
    """The measured defect: 118 tokens reserved for a request the server counted at 432 (tools left out)."""
    rig = make_rig(backend_name, fake)
    fake.enqueue(Reply(tool_use("read_note", {})), Reply("done"))
    run_id, terminal = await rig.run("summarise the note " * 30, max_tokens=16)
    assert terminal == EventType.DONE
    allows = _model_records(rig, "allow")
    assert len(allows) == len(fake.requests) == 2
    for allow, request in zip(allows, fake.requests, strict=True):
        body = request.body
        assert body["tools"]  # tools were offered, and counted
        assert allow.arguments["estimated_input_tokens"] >= count_request_tokens(body)
        assert allow.arguments["max_output_tokens"] == 16
    assert [r.arguments["basis"] for r in _model_records(rig, "settled")] == ["reported", "reported"]


@pytest.mark.parametrize("usage", [Usage(input_tokens=10**12, output_tokens=10**12), Usage(input_tokens=-1000),
                                   Usage(input_tokens=5, output_tokens=-7)])
async def test_absurd_usage_is_clamped_to_the_reservation(fake, backend_name, usage):
    budget = Budget(requests_per_minute=None, tokens_per_day=1_000_000, cost_per_day_usd=None)
    rig = make_rig(backend_name, fake, budget=budget)
    fake.enqueue(Reply("fine", usage=usage), Reply("again"))
    run_id, terminal = await rig.run(max_tokens=64)
    assert terminal == EventType.DONE
    (allow,) = _model_records(rig, "allow")
    (settled,) = _model_records(rig, "settled")
    reserved = allow.arguments["estimated_tokens"]
    if backend_name == "openai" and usage.input_tokens < 0 and not usage.output_tokens:
        # the OpenAI adapter reads a negative prompt count as 0: nothing absurd is left, so the
        # run reports only the output, which is within bounds
        assert settled.arguments["basis"] == "reported"
    else:
        assert settled.arguments["basis"] == "clamped"
        assert settled.arguments["tokens"] == reserved == _ledger(rig)["tokens"]
        (event,) = rig.events.of(EventType.USAGE, run_id)  # the charged counts, never the absurd ones
        assert event["basis"] == "clamped" and event["input_tokens"] + event["output_tokens"] == reserved
        assert min(event["input_tokens"], event["output_tokens"]) >= 0
    assert _ledger(rig)["tokens"] <= reserved
    # not locked out for the day: the next run goes through
    again = await rig.manager.start(rig.ctx("conv-2"), rig.params("once more"))
    assert await rig.events.terminal(again) == EventType.DONE


async def test_a_stream_without_usage_is_charged_an_estimate():
    """A llama.cpp server streams no usage: the run is charged the input estimate plus its output's."""
    with FakeOpenAI(api_key=KEY, stream_usage=False) as fake:
        rig = make_rig("openai", fake)
        fake.enqueue(Reply("a fairly short answer of some words"))
        run_id, terminal = await rig.run(max_tokens=200)
        assert terminal == EventType.DONE
        assert "usage" not in str(fake.requests[0].body.get("usage", ""))
        (allow,) = _model_records(rig, "allow")
        (settled,) = _model_records(rig, "settled")
        assert settled.arguments["basis"] == "estimated"
        charged = settled.arguments["tokens"]
        est_input = allow.arguments["estimated_input_tokens"]
        assert est_input < charged <= est_input + 200  # the input estimate plus a few output tokens
        assert _ledger(rig)["tokens"] == charged > 0 and settled.arguments["cost_usd"] > 0
        # the cell's footer counts what was charged, not the 0 the server reported
        (event,) = rig.events.of(EventType.USAGE, run_id)
        assert event["basis"] == "estimated" and event["input_tokens"] + event["output_tokens"] == charged
        assert event["cost_usd"] == settled.arguments["cost_usd"]


async def test_a_cancelled_stream_is_charged_its_reservation(fake, backend_name):
    rig = make_rig(backend_name, fake)
    fake.enqueue(Reply("word " * 400, tokens_per_second=200, chunk_tokens=1))
    run_id = await rig.manager.start(rig.ctx(), rig.params(max_tokens=500))
    await rig.events.wait_for(EventType.TEXT_DELTA, run_id)
    rig.manager.cancel(run_id)
    assert await rig.events.terminal(run_id) == EventType.CANCELLED
    (allow,) = _model_records(rig, "allow")
    (settled,) = _model_records(rig, "settled")
    assert settled.arguments["basis"] == "reservation" and settled.arguments["outcome"] == "interrupted"
    assert _ledger(rig)["tokens"] == allow.arguments["estimated_tokens"]
    assert _ledger(rig)["reserved_tokens"] == 0


async def test_a_stream_cut_mid_answer_is_charged_its_reservation(fake, backend_name):
    rig = make_rig(backend_name, fake)
    fake.enqueue(Reply("word " * 50, drop_after=3))
    run_id, terminal = await rig.run(max_tokens=300)
    assert terminal == EventType.ERROR
    (allow,) = _model_records(rig, "allow")
    (settled,) = _model_records(rig, "settled")
    assert settled.arguments["basis"] == "reservation"
    assert _ledger(rig)["tokens"] == allow.arguments["estimated_tokens"]


async def test_an_http_error_answer_is_charged_nothing(fake, backend_name):
    rig = make_rig(backend_name, fake)
    fake.enqueue_error(400, message="bad request (fake)")
    run_id, terminal = await rig.run(max_tokens=300)
    assert terminal == EventType.ERROR
    (settled,) = _model_records(rig, "settled")
    assert settled.arguments["basis"] == "refused" and _ledger(rig)["tokens"] == 0


async def test_concurrent_runs_never_pass_the_day_limit(fake, backend_name):
    """16 runs at once in one broker against a day that fits a few reservations; every request reports
    absurd usage, so each is charged its whole reservation: the ledger still ends within the limit."""
    rig0 = make_rig(backend_name, fake)
    fake.enqueue(Reply("probe"))
    await rig0.run(max_tokens=100)
    per_request = _model_records(rig0, "allow")[0].arguments["estimated_tokens"]
    limit = per_request * 5 + per_request // 2
    budget = Budget(requests_per_minute=None, tokens_per_day=limit, cost_per_day_usd=None)
    rig = make_rig(backend_name, fake, budget=budget)
    for _ in range(16):
        fake.enqueue(Reply("word " * 20, tokens_per_second=400, usage=Usage(input_tokens=10**12, output_tokens=1)))
    run_ids = [await rig.manager.start(rig.ctx(f"c{i}"), rig.params(max_tokens=100)) for i in range(16)]
    terminals = await asyncio.gather(*(rig.events.terminal(r, timeout=30) for r in run_ids))
    assert terminals.count(EventType.DONE) == 5
    assert terminals.count(EventType.BUDGET_EXHAUSTED) == 11
    u = _ledger(rig)
    assert u["tokens"] <= limit and u["reserved_tokens"] == 0
    assert u["tokens"] == sum(r.arguments["tokens"] for r in _model_records(rig, "settled"))


async def test_an_unreachable_server_is_charged_nothing():
    """A stopped local model server: retrying the cell must not eat the day budget."""
    import socket

    from relay_jupyter.backends.openai import OpenAIBackend

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with FakeOpenAI(api_key=KEY) as fake:
        dead = OpenAIBackend(f"http://127.0.0.1:{port}/v1", KEY, models=("gpt-fake-*",), timeout=5)
        rig = make_rig("openai", fake, extra_backends={"dead": dead})
        run_id, terminal = await rig.run(max_tokens=300, backend="dead")
        assert terminal == EventType.ERROR
        error = rig.events.of(EventType.ERROR, run_id)[0]
        assert error["code"] == "BACKEND_UNREACHABLE" and "cannot reach" in error["message"]
        (settled,) = _model_records(rig, "settled")
        assert settled.arguments["basis"] == "refused" and _ledger(rig)["tokens"] == 0
