"""Model-server faults through the real runtime: RunManager with the real Anthropic and OpenAI backends
against the shipped FaultModelServer. Each fault ends the run with its code and exactly one terminal
event; partial text is kept and marked incomplete; an unclosed tool call is never executed.

Deadlines are configured short (RuntimeConfig); nothing here asserts on elapsed time.
"""

from __future__ import annotations

import pytest

from relay_jupyter.backends.base import Progress
from relay_jupyter.core.consent import StaticConsent
from relay_jupyter.core.types import ConsentDecision
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.runtime.manager import RuntimeConfig
from relay_jupyter.testing import FaultModelServer

from .rig import KEY, make_rig

pytestmark = pytest.mark.asyncio

SHORT = RuntimeConfig(coalesce_interval=0.01, turn_timeout=1.5, turn_idle_timeout=0.5)
TEXT = "the fault server starts an answer"


@pytest.fixture(params=["anthropic", "openai"])
def backend_name(request):
    return request.param


@pytest.fixture
def fault():
    with FaultModelServer(api_key=KEY, interval=0.05, max_seconds=20) as server:
        yield server


async def run_fault(backend_name, server, fault_name, config=SHORT, **rig_kw):
    server.fault = fault_name
    rig = make_rig(backend_name, server, config=config, **rig_kw)
    run_id, terminal = await rig.run()
    terminals = [t for t in rig.events.types(run_id) if t in TERMINAL_EVENTS]
    assert terminals == [terminal], terminals  # exactly one terminal event
    await rig.manager.aclose()
    return rig, run_id, terminal


def error_of(rig, run_id):
    (error,) = rig.events.of(EventType.ERROR, run_id)
    return error


def last_assistant(rig):
    msgs = [m for m in rig.history() if m["role"] == "assistant"]
    return msgs[-1] if msgs else None


async def test_pings_do_not_keep_a_turn_alive(backend_name, fault):
    rig, run_id, terminal = await run_fault(backend_name, fault, "stall_pings")
    assert terminal == EventType.ERROR
    error = error_of(rig, run_id)
    assert error["code"] == "BACKEND_TIMEOUT" and "turn_idle_timeout" in error["message"]
    assert error["incomplete"] is True
    kept = last_assistant(rig)
    assert kept["incomplete"] is True and kept["content"][0]["text"].startswith("the")


async def test_a_trickle_hits_the_overall_deadline(backend_name, fault):
    rig, run_id, terminal = await run_fault(backend_name, fault, "trickle")
    error = error_of(rig, run_id)
    # each word reset the idle deadline: it is the overall one that ended the turn
    assert error["code"] == "BACKEND_TIMEOUT" and "took longer than turn_timeout" in error["message"]
    assert "sent no content" not in error["message"]
    kept = last_assistant(rig)
    words = kept["content"][0]["text"].split()
    assert kept["incomplete"] is True and len(words) > 3
    streamed = "".join(d["text"] for d in rig.events.of(EventType.TEXT_DELTA, run_id))
    assert streamed == kept["content"][0]["text"]


async def test_truncated_stream_is_an_error_and_its_open_tool_call_never_runs(backend_name, fault):
    rig, run_id, terminal = await run_fault(backend_name, fault, "truncate",
                                            consent=StaticConsent(ConsentDecision.ALLOW))
    error = error_of(rig, run_id)
    assert error["code"] == "BACKEND_ERROR"
    assert "closed the stream before the answer ended" in error["message"]
    assert rig.tools.written == []  # the open write_file call was never executed
    kept = last_assistant(rig)
    assert kept["incomplete"] is True and kept["content"][0]["text"] == TEXT
    assert all(b["type"] != "tool_use" for b in kept["content"])
    assert len(fault.requests) == 1


async def test_oversized_line_is_refused_while_read(backend_name, fault):
    rig, run_id, terminal = await run_fault(backend_name, fault, "oversized")
    error = error_of(rig, run_id)
    assert error["code"] == "BACKEND_ERROR" and "larger than" in error["message"]
    assert fault.oversize_sent < fault.oversize_bytes  # refused long before the 64 MB line ended
    assert last_assistant(rig)["content"][0]["text"] == TEXT


@pytest.mark.parametrize("fault_name", ["malformed_json", "malformed_sse"])
async def test_malformed_stream_is_backend_error(backend_name, fault, fault_name):
    rig, run_id, terminal = await run_fault(backend_name, fault, fault_name)
    error = error_of(rig, run_id)
    assert error["code"] == "BACKEND_ERROR" and "malformed" in error["message"]
    assert error["incomplete"] is True


async def test_cut_connection_is_unreachable(backend_name, fault):
    rig, run_id, terminal = await run_fault(backend_name, fault, "cut")
    error = error_of(rig, run_id)
    assert error["code"] == "BACKEND_UNREACHABLE" and "cut" in error["message"]
    assert last_assistant(rig)["incomplete"] is True


async def test_error_event_reports_the_servers_type_and_message_redacted(backend_name, fault):
    fault.error_message = f"Overloaded, try later (key {KEY} / sk-ant-api03-abcdefghijklmnop)"
    rig, run_id, terminal = await run_fault(backend_name, fault, "error_event")
    error = error_of(rig, run_id)
    assert error["code"] == "BACKEND_ERROR"
    assert "failed mid-stream (overloaded_error: Overloaded, try later" in error["message"]
    assert "HTTP 200" not in error["message"]
    assert KEY not in str(rig.events.events) and "abcdefghijklmnop" not in str(rig.events.events)


async def test_unreachable_server(backend_name, fault):
    class Gone:  # where the fault server was: nothing listens there any more
        base_url = fault.base_url

    fault.stop()
    rig = make_rig(backend_name, Gone(), config=SHORT)
    run_id, terminal = await rig.run()
    error = error_of(rig, run_id)
    assert error["code"] == "BACKEND_UNREACHABLE" and "cannot reach" in error["message"]
    assert "Check that the model server is running" in error["message"]
    assert [t for t in rig.events.types(run_id) if t in TERMINAL_EVENTS] == [EventType.ERROR]
    assert "incomplete" not in error  # nothing was said


@pytest.mark.parametrize("fault_name", ["ok", "no_usage"])
async def test_complete_answers_finish(backend_name, fault, fault_name):
    rig, run_id, terminal = await run_fault(backend_name, fault, fault_name)
    assert terminal == EventType.DONE
    kept = last_assistant(rig)
    assert kept["content"][0]["text"] == TEXT and "incomplete" not in kept


async def test_internal_is_only_for_bugs_and_logs_a_traceback(fault, caplog):
    class Buggy:
        name = "buggy"

        def allows_model(self, model):
            return True

        async def stream_turn(self, model, system, messages, tools, max_tokens):
            yield Progress()
            raise RuntimeError("a bug in relay, not the model server")

    rig = make_rig("anthropic", fault, config=SHORT, extra_backends={"buggy": Buggy()})
    with caplog.at_level("ERROR", logger="relay_jupyter.runtime.manager"):
        run_id, terminal = await rig.run(backend="buggy")
    error = error_of(rig, run_id)
    assert error["code"] == "INTERNAL" and error["message"] == "internal error (RuntimeError)"
    (record,) = [r for r in caplog.records if run_id in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError  # the traceback is logged
