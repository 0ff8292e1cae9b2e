"""Telemetry and lineage of the Anthropic-compatible endpoint (issue 16 items 4 and 5) on the plain app the
daemon serves, in process: the official ``anthropic`` SDK against ``relay/anthropic/v1/messages`` with the
shipped FakeAnthropic as the upstream.

Proves: one telemetry row per forwarded request with the gate's charge, latency, time to first byte and
status (ok, upstream_error, interrupted by the max_tokens ceiling); sessions from ``x-relay-session`` /
Claude Code's header or the fingerprint; lineage continuation / undo / compaction / diverged over a real
request sequence; a failed request's history is not stored (the next one is classified against the last
success); refusals before forwarding leave no row; rows never hold the prompt.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant
from relay_jupyter.server.plain import make_app
from relay_jupyter.testing import FakeAnthropic
from relay_jupyter.testing.script import ErrorReply, Reply, Usage, text

KEY = "sk-ant-broker-key-for-telemetry-0123456789"
MODEL = "claude-test-1"
ORIGIN = "daemon:a"
PROMPT = "PROMPT-TEXT-never-in-telemetry-5e1d"


@pytest.fixture(scope="module")
def upstream():
    with FakeAnthropic(api_key=KEY, models=(MODEL,)) as server:
        yield server


@pytest_asyncio.fixture
async def served(upstream):
    broker = Broker.open(BrokerConfig(in_memory=True, anthropic_api_key=KEY, anthropic_base_url=upstream.base_url))
    broker.grants.issue(Grant(origin=ORIGIN, models=frozenset({MODEL}), consent_id="test"))

    def resolve(handler: Any) -> Caller:
        name = handler.request.headers.get("X-Relay-Client", "a")
        return Caller(kind=CallerKind.DAEMON, origin=f"daemon:{name}", client_id=f"daemon:{name}:1")

    server = make_app(broker, resolve).listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    yield broker, f"http://127.0.0.1:{port}/relay/anthropic"
    for client in _CLIENTS:
        await client.close()
    _CLIENTS.clear()
    server.stop()
    await server.close_all_connections()
    await server.request_callback.settings["relay_anthropic_proxy"].aclose()
    broker.close()


_CLIENTS: list[anthropic.AsyncAnthropic] = []


def _client(base: str, **headers: str) -> anthropic.AsyncAnthropic:
    _CLIENTS.append(anthropic.AsyncAnthropic(api_key="x", base_url=base, max_retries=0, default_headers=headers))
    return _CLIENTS[-1]


def _turns(*texts: str) -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(texts)]


@pytest.mark.asyncio
async def test_rows_and_lineage_over_a_conversation(served, upstream) -> None:
    broker, base = served
    client = _client(base)
    upstream.enqueue(Reply(text("a1"), usage=Usage(input_tokens=3, output_tokens=2)),
                     Reply(text("a2"), usage=Usage(input_tokens=5, output_tokens=2)),
                     Reply(text("a2 again"), usage=Usage(input_tokens=5, output_tokens=3)),
                     Reply(text("fresh"), usage=Usage(input_tokens=4, output_tokens=1)))
    sys = "you are terse"
    await client.messages.create(model=MODEL, max_tokens=50, system=sys, messages=_turns(PROMPT))
    stream = await client.messages.create(model=MODEL, max_tokens=50, system=sys, stream=True,
                                          messages=_turns(PROMPT, "a1", "q2"))
    async for _ in stream:
        pass
    await client.messages.create(model=MODEL, max_tokens=50, system=sys, messages=_turns(PROMPT, "a1", "q2 edited"))
    await client.messages.create(model=MODEL, max_tokens=50, system=sys, messages=_turns("another start"))
    rows = broker.telemetry.query(origin=ORIGIN)
    assert [r.lineage for r in rows] == ["new", "continuation", "undo", "new"]
    assert rows[0].session == rows[1].session == rows[2].session != rows[3].session
    assert all(r.session.startswith("fp:") and r.source == "proxy" and r.status == "ok" for r in rows)
    assert [(r.input_tokens, r.output_tokens) for r in rows] == [(3, 2), (5, 2), (5, 3), (4, 1)]
    assert all(r.cost_usd > 0 and not r.estimated and r.ttft_ms is not None and r.ttft_ms <= r.latency_ms
               for r in rows)
    # the charge in the row is the one the gate audited
    settled = [r for r in broker.audit.tail(100, origin=ORIGIN) if r.decision == "settled"]
    assert [round(s.arguments["cost_usd"], 6) for s in settled] == [round(r.cost_usd, 6) for r in rows]
    assert PROMPT in json.dumps(upstream.requests[0].body)
    assert PROMPT not in json.dumps([r.model_dump() for r in rows])
    text_metrics = broker.metrics.render().decode()
    assert 'relay_model_requests_total{source="proxy",status="ok"} 4.0' in text_metrics
    assert 'relay_model_ttft_seconds_count{source="proxy"} 4.0' in text_metrics


@pytest.mark.asyncio
async def test_a_failed_request_is_not_stored_as_the_sessions_history(served, upstream) -> None:
    broker, base = served
    client = _client(base, **{"x-relay-session": "sess-1"})
    upstream.enqueue(Reply(text("a1")), ErrorReply(status=400, message="nope"), Reply(text("a2")))
    await client.messages.create(model=MODEL, max_tokens=20, messages=_turns("q1"))
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.create(model=MODEL, max_tokens=20, messages=_turns("other", "x", "y"))
    # classified against the last *successful* request: q1 is a prefix, so a continuation
    await client.messages.create(model=MODEL, max_tokens=20, messages=_turns("q1", "a1", "q2"))
    rows = broker.telemetry.query(origin=ORIGIN)
    assert [(r.session, r.lineage, r.status) for r in rows] == [
        ("sess-1", "new", "ok"), ("sess-1", "diverged", "upstream_error"), ("sess-1", "continuation", "ok")]
    assert rows[1].error_code == "HTTP_400" and rows[1].tokens == 0 and rows[1].cost_usd == 0


@pytest.mark.asyncio
async def test_claude_codes_session_header_compaction_and_per_origin_sessions(served, upstream) -> None:
    broker, base = served
    cc = _client(base, **{"X-Claude-Code-Session-Id": "0b8c2f6e-1111-2222-3333-444455556666"})
    upstream.enqueue(*(Reply(text(f"r{i}")) for i in range(3)))
    history = _turns("u1", "a1", "u2", "a2", "u3")
    await cc.messages.create(model=MODEL, max_tokens=20, messages=history)
    # the client summarised its beginning and kept the last messages: a compaction
    await cc.messages.create(model=MODEL, max_tokens=20,
                             messages=[{"role": "user", "content": "summary of u1..a1"}] + history[2:] +
                             [{"role": "assistant", "content": "a3"}, {"role": "user", "content": "u4"}])
    # the same session id from another origin is another session
    other = _client(base, **{"X-Claude-Code-Session-Id": "0b8c2f6e-1111-2222-3333-444455556666",
                             "X-Relay-Client": "b"})
    broker.grants.issue(Grant(origin="daemon:b", models=frozenset({MODEL}), consent_id="test"))
    await other.messages.create(model=MODEL, max_tokens=20, messages=history + [{"role": "assistant", "content": "y"}])
    a_rows = broker.telemetry.query(origin=ORIGIN)
    b_rows = broker.telemetry.query(origin="daemon:b")
    assert [r.lineage for r in a_rows] == ["new", "compaction"]
    assert a_rows[0].session == "0b8c2f6e-1111-2222-3333-444455556666"
    assert [(r.session, r.lineage) for r in b_rows] == [("0b8c2f6e-1111-2222-3333-444455556666", "new")]


@pytest.mark.asyncio
async def test_refusals_before_forwarding_leave_no_row_and_a_cut_answer_is_interrupted(served, upstream) -> None:
    broker, base = served
    client = _client(base)
    with pytest.raises(anthropic.PermissionDeniedError):
        await client.messages.create(model="claude-other-9", max_tokens=5, messages=_turns("x"))
    with pytest.raises(anthropic.PermissionDeniedError):
        await _client(base, **{"X-Relay-Client": "nogrant"}).messages.create(
            model=MODEL, max_tokens=5, messages=_turns("x"))
    assert broker.telemetry.query() == []
    upstream.enqueue(Reply(text("word " * 2000)))
    stream = await client.messages.create(model=MODEL, max_tokens=4, stream=True, messages=_turns("x"))
    with pytest.raises(anthropic.APIStatusError):
        async for _ in stream:
            pass
    [row] = broker.telemetry.query()
    assert row.status == "interrupted" and row.error_code == "BUDGET_EXCEEDED" and row.estimated
    assert row.lineage == "new" and not upstream.pending
    # an interrupted request stores no history: the same request again is still "new"
    upstream.enqueue(Reply(text("ok")))
    await client.messages.create(model=MODEL, max_tokens=4, messages=_turns("x"))
    assert broker.telemetry.query()[-1].lineage == "new"


@pytest.mark.asyncio
async def test_the_openai_endpoint_records_lineage_and_a_profile_is_in_the_row(tmp_path) -> None:
    """The OpenAI-compatible endpoint shares the recording path: its rows carry session and lineage too, and
    a request through a named profile (``X-Relay-Profile``) names it in its row."""
    import openai

    from relay_jupyter.testing import FakeOpenAI

    team_key = "sk-ant-team-key-for-telemetry-fedcba98"
    secrets = tmp_path / "secrets.json"
    secrets.write_text(json.dumps({"team.anthropic": team_key}))
    secrets.chmod(0o600)
    with FakeOpenAI(models=("gpt-fake-1",)) as local, FakeAnthropic(api_key=team_key, models=(MODEL,)) as team:
        broker = Broker.open(BrokerConfig(in_memory=True, openai_base_url=local.base_url, anthropic_api_key=KEY,
                                          secrets_file=secrets, profiles={"team": {"anthropic_base_url": team.base_url}}))
        broker.grants.issue(Grant(origin=ORIGIN, models=frozenset({MODEL, "gpt-fake-1"}),
                                  profiles=frozenset({"team"}), consent_id="test"))
        server = make_app(broker, lambda h: Caller(kind=CallerKind.DAEMON, origin=ORIGIN, client_id="daemon:a:1")
                          ).listen(0, "127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        oa = openai.AsyncOpenAI(api_key="x", base_url=f"http://127.0.0.1:{port}/relay/openai/v1", max_retries=0)
        an = anthropic.AsyncAnthropic(api_key="x", base_url=f"http://127.0.0.1:{port}/relay/anthropic", max_retries=0,
                                      default_headers={"X-Relay-Profile": "team"})
        try:
            local.enqueue(Reply(text("one")), Reply(text("two")))
            chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"}]
            await oa.chat.completions.create(model="gpt-fake-1", max_tokens=20, messages=chat)
            await oa.chat.completions.create(model="gpt-fake-1", max_tokens=20, messages=chat + [
                {"role": "assistant", "content": "one"}, {"role": "user", "content": "q2"}])
            team.enqueue(Reply(text("via the team")))
            await an.messages.create(model=MODEL, max_tokens=20, messages=_turns("hello team"))
            rows = broker.telemetry.query(origin=ORIGIN)
            assert [(r.model, r.lineage, r.profile, r.status) for r in rows] == [
                ("gpt-fake-1", "new", None, "ok"), ("gpt-fake-1", "continuation", None, "ok"),
                (MODEL, "new", "team", "ok")]
            assert rows[0].session == rows[1].session and rows[0].session.startswith("fp:")
        finally:
            await oa.close()
            await an.close()
            server.stop()
            await server.close_all_connections()
            for name in ("relay_anthropic_proxy", "relay_openai_proxy"):
                proxy = server.request_callback.settings.get(name)
                if proxy is not None:
                    await proxy.aclose()
            broker.close()
