"""Telemetry rows (core/telemetry.py): %%agent runs record one row per model turn through the broker's
recorder, the /metrics histograms follow, and no row can hold prompt text or a secret."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import RetryPolicy
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.runtime_setup import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.memory import MemoryStore
from relay_jupyter.core.telemetry import Telemetry, TelemetryRow
from relay_jupyter.core.types import Grant, Usage
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.storage import Store
from relay_jupyter.testing import FakeAnthropic, Reply, tool_use
from relay_jupyter.testing.script import Usage as FakeUsage


A = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb#k1", client_id="kernel:aaa")
SECRET_PROMPT = "the-launch-code-is-PROMPT-TEXT-7f3a"
KEY = "sk-test-telemetry-key-0123456789"


def make_backend(fake: FakeAnthropic) -> AnthropicBackend:
    return AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",), timeout=10,
                            retry=RetryPolicy(max_attempts=1, base_delay=0.01, max_delay=0.1, max_total_wait=1.0))


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


def broker_with(fake, **config) -> Broker:
    broker = Broker.open(BrokerConfig(in_memory=True, default_model="claude-test-1", **config))
    broker.grants.issue(Grant(origin=A.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    install_runtime(broker, {"anthropic": make_backend(fake)})
    return broker


async def finished(broker: Broker, run_id: str) -> str:
    await broker.runs.wait(run_id)
    return [e.type for e in broker.store.events_since(0) if e.run_id == run_id and e.type in TERMINAL_EVENTS][0]


@pytest.mark.asyncio
async def test_an_agent_run_records_a_row_per_turn_with_the_charged_usage(fake) -> None:
    broker = broker_with(fake)
    fake.enqueue(Reply(tool_use("no_such_tool", {"x": 1}), usage=FakeUsage(input_tokens=4, output_tokens=9)),
                 Reply("done", usage=FakeUsage(input_tokens=5, output_tokens=3, cache_read_input_tokens=2)))
    run = await call_method(broker, A, "run.start", {"conversation": "cell-1", "prompt": SECRET_PROMPT})
    assert await finished(broker, run["run_id"]) == EventType.DONE
    rows = broker.telemetry.query(origin=A.origin)
    assert len(rows) == 2 and [r.source for r in rows] == ["agent", "agent"]
    assert all(r.status == "ok" and r.run_id == run["run_id"] and r.session == "cell-1" for r in rows)
    assert all(r.model == "claude-test-1" and r.latency_ms > 0 for r in rows)
    assert all(r.ttft_ms is not None and 0 <= r.ttft_ms <= r.latency_ms for r in rows)
    # the figures are the gate's charge: what the run.usage events said, summed over the run
    usage = broker.store.events_since(0)
    charged = [e.data for e in usage if e.type == EventType.USAGE and e.run_id == run["run_id"]]
    assert [(r.input_tokens, r.output_tokens, r.cache_read_tokens) for r in rows] == \
        [(c["input_tokens"], c["output_tokens"], c["cache_read_input_tokens"]) for c in charged] == \
        [(4, 9, 0), (5, 3, 2)]
    assert [round(r.cost_usd, 9) for r in rows] == [round(c["cost_usd"], 9) for c in charged]
    assert all(r.cost_usd > 0 and r.estimated is False for r in rows)
    # the rows hold figures, never the prompt (the fake did receive it)
    assert SECRET_PROMPT in json.dumps(fake.requests[0].body)
    assert SECRET_PROMPT not in json.dumps([r.model_dump() for r in rows])
    # and /metrics counts them
    text = broker.metrics.render().decode()
    assert 'relay_model_requests_total{source="agent",status="ok"} 2.0' in text
    assert 'relay_model_request_seconds_count{source="agent"} 2.0' in text
    assert 'relay_model_ttft_seconds_count{source="agent"} 2.0' in text
    assert 'relay_model_tokens_total{kind="input",source="agent"} 9.0' in text


@pytest.mark.asyncio
async def test_a_failed_turn_is_recorded_with_its_status_and_code(fake) -> None:
    broker = broker_with(fake)
    from relay_jupyter.testing.script import ErrorReply

    fake.enqueue(ErrorReply(status=400, message="bad request (fake)"))
    run = await call_method(broker, A, "run.start", {"conversation": "cell-2", "prompt": "hi"})
    assert await finished(broker, run["run_id"]) == EventType.ERROR
    [row] = broker.telemetry.query()
    assert row.status == "upstream_error" and row.error_code is not None and row.ttft_ms is None
    assert row.tokens == 0 and row.cost_usd == 0  # an HTTP error before any event is not charged


def _row(**kw) -> dict:
    base = {"ts": 1.0, "origin": "notebook:a.ipynb", "source": "proxy", "model": "claude-sonnet-4-5"}
    return {**base, **kw}


@pytest.mark.parametrize("bad", [
    {"session": "what is the launch code? tell me everything"},  # free text is not a session id
    {"session": "x" * 129},
    {"model": "m\nINJECTED"},
    {"origin": ""},
    {"error_code": "the key sk-ant-123 was wrong"},
    {"profile": "team key=sk-ant-abc"},
    {"run_id": "r\x00"},
    {"input_tokens": -1},
    {"cost_usd": math.nan},
    {"latency_ms": math.inf},
    {"status": "fine"},
    {"source": "browser"},
    {"lineage": "sideways"},
    {"prompt": "an extra field"},
])
def test_a_row_refuses_text_where_figures_and_ids_belong(bad) -> None:
    with pytest.raises(ValidationError):
        TelemetryRow(**_row(**bad))


def test_a_row_stored_in_sqlite_has_only_the_declared_columns(tmp_path) -> None:
    """The table cannot grow a text column by accident: the stored columns are the model's fields."""
    with Store.open(tmp_path / "relay.db") as store:
        cols = [r[1] for r in store.query("PRAGMA table_info(telemetry)")]
        assert cols == list(TelemetryRow.model_fields)
        t = Telemetry(store)
        row = t.record(origin="notebook:a.ipynb", model="claude-sonnet-4-5", source="proxy",
                       usage=Usage(input_tokens=3, output_tokens=4), cost_usd=0.01, latency_ms=20.0, ttft_ms=5.0,
                       session="s-1", lineage="continuation")
        assert row is not None and store.query_telemetry() == [row]
        assert row.ts == pytest.approx(row.ts)  # started latency before now


def test_recording_never_raises_into_the_request_when_the_store_fails() -> None:
    store = MemoryStore()
    seen: list[TelemetryRow] = []
    t = Telemetry(store, observers=[seen.append, lambda r: 1 / 0])
    store.close()
    assert t.record(origin="o", model="m", source="proxy", latency_ms=1.0) is None
    assert seen == []  # nothing stored: observers are not told
    t2 = Telemetry(MemoryStore(), observers=[lambda r: 1 / 0, seen.append])
    row = t2.record(origin="o", model="m", source="proxy", latency_ms=1.0)
    assert row is not None and seen == [row]  # a failing observer neither loses the row nor the others


def test_ts_is_the_start_of_the_request() -> None:
    t = Telemetry(MemoryStore(), clock=lambda: 1000.0)
    row = t.record(origin="o", model="m", source="agent", latency_ms=2500.0)
    assert row is not None and row.ts == 997.5


def test_retention_prunes_old_rows_with_the_events(tmp_path) -> None:
    """``telemetry_retention_seconds``: the broker's hourly pruning drops rows of requests older than it."""
    broker = Broker.open(BrokerConfig(data_dir=str(tmp_path), telemetry_retention_seconds=3600.0))
    try:
        now = broker.telemetry.now()
        old = broker.telemetry.record(origin="o", model="m", source="proxy", ts=now - 7200.0)
        new = broker.telemetry.record(origin="o", model="m", source="proxy", ts=now - 60.0)
        assert old is not None and new is not None
        broker.prune_events()  # outside an event loop it prunes now
        assert broker.telemetry.query() == [new]
    finally:
        broker.close()
