"""Elicitation: a server's question reaches the notebook whose run made the call, as a card; nothing accepts on its own.

Real servers over stdio: ``elicit_server.py`` (MCP SDK 2.3, protocol 2026-07-28: the question rides an
``InputRequiredResult``), ``raw_mcp_server.py`` (2025-06-18, hand-written: any schema, any number of
questions, stalls) and, marked ``peer``, ``old_sdk_server.py`` on the MCP SDK 1.12. The router is the
broker's real one on a real (in-memory) broker: its event bus and audit.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.elicitations import ElicitationRouter
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import RoutingRefusal
from relay_jupyter.mcp.config import StdioServerConfig
from relay_jupyter.mcp.connection import McpConnection, _InFlight
from relay_jupyter.mcp.elicitation import (
    MAX_PER_CALL,
    MAX_SCHEMA_BYTES,
    Refused,
    call_context,
    check_answer,
    defaults_of,
    parse_form,
)
from relay_jupyter.protocol.names import EventType

from mcp_support import old_server

HERE = Path(__file__).parent
ORIGIN = "notebook:a.ipynb"
KERNEL = Caller(kind=CallerKind.KERNEL, origin=ORIGIN, client_id="kernel:aaa")
OTHER_KERNEL = Caller(kind=CallerKind.KERNEL, origin="notebook:b.ipynb", client_id="kernel:bbb")
SAME_NOTEBOOK_OTHER_CLIENT = Caller(kind=CallerKind.KERNEL, origin=ORIGIN, client_id="kernel:aaa2")
SECRET_VALUE = "Ada-typed-this-7f3e"


@dataclass(frozen=True)
class Ctx:
    """What the executor passes as the call's context (a ToolContext's fields)."""

    origin: str = ORIGIN
    originator: str = "kernel:aaa"
    run_id: str = "run_1"
    conversation: str = "c1"


@pytest_asyncio.fixture
async def broker():
    b = Broker.open(BrokerConfig(in_memory=True, consent_timeout=30.0))
    yield b
    b.close()


def router_of(broker: Broker, timeout: float = 30.0) -> ElicitationRouter:
    return ElicitationRouter(broker.events, audit=broker.audit, timeout=timeout)


def events(broker: Broker, kind: str | None = None) -> list[Any]:
    return [e for e in broker.store.events_since(0) if kind is None or e.type == kind]


async def next_request(broker: Broker, seen: int = 0) -> dict[str, Any]:
    for _ in range(1000):
        found = events(broker, EventType.ELICITATION_REQUEST)
        if len(found) > seen:
            return found[seen].data
        await asyncio.sleep(0.01)
    raise AssertionError("no elicitation.request")


def raw(tmp_path: Path, schema: dict[str, Any] | None = None, *extra: str, message: str = "Your name?"
        ) -> StdioServerConfig:
    args = [str(HERE / "raw_mcp_server.py"), "--version", "2025-06-18", *extra]
    if schema is not None:
        spec = tmp_path / "elicit.json"
        spec.write_text(json.dumps({"message": message, "requestedSchema": schema}))
        args += ["--elicit", str(spec)]
    return StdioServerConfig(name="raw", command=sys.executable, args=args)


NAME_FORM = {"type": "object", "properties": {"name": {"type": "string", "title": "Name"},
                                              "age": {"type": "integer", "minimum": 0, "default": 30}},
             "required": ["name"]}


# -- the form: bounded, no secrets ------------------------------------------------------------------

def test_a_form_is_parsed_bounded_and_checked() -> None:
    message, fields = parse_form("Who are you?", NAME_FORM)
    assert message == "Who are you?" and [f.name for f in fields] == ["name", "age"]
    assert check_answer(fields, {"name": "Ada", "age": 36}) == {"name": "Ada", "age": 36}
    for bad, why in [({"age": 3}, "required"), ({"name": "A", "age": -1}, "between"), ({"name": 5}, "text"),
                     ({"name": "A", "extra": 1}, "unknown field"), ({"name": "A", "age": 1.5}, "whole number"),
                     ({"name": "A", "age": True}, "whole number")]:
        with pytest.raises(ValueError, match=why):
            check_answer(fields, bad)
    assert defaults_of(NAME_FORM) == {"age": 30}


@pytest.mark.parametrize(("schema", "kind", "why"), [
    ({"type": "object", "properties": {f"f{i}": {"type": "string", "description": "x" * 900} for i in range(30)}},
     "limit", f"limit {MAX_SCHEMA_BYTES}"),
    ({"type": "object", "properties": {f"f{i}": {"type": "boolean"} for i in range(21)}}, "limit", "21 fields"),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}, "schema", "flat fields only"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "regex"}}}, "schema", "unsupported string"),
    ({"type": "array"}, "schema", "not a flat object"),
    ({"type": "object", "properties": {"pw": {"type": "string", "format": "password"}}}, "secret", "credential"),
    ({"type": "object", "properties": {"password": {"type": "string"}}}, "secret", "'password'"),
    ({"type": "object", "properties": {"githubToken": {"type": "string"}}}, "secret", "credential"),
    ({"type": "object", "properties": {"key": {"type": "string", "description": "Your OpenAI API key"}}}, "secret",
     "credential"),
    ({"type": "object", "properties": {"x": {"type": "string", "enum": [str(i) for i in range(51)]}}}, "schema",
     "51 choices"),
    ({"type": "object", "properties": {"n": {"type": "string"}}, "required": ["m"]}, "schema", "does not define"),
])
def test_forms_relay_does_not_show(schema: dict[str, Any], kind: str, why: str) -> None:
    with pytest.raises(Refused) as info:
        parse_form("please", schema)
    assert info.value.kind == kind and why in info.value.reason


def test_a_huge_message_is_cut_and_control_characters_removed() -> None:
    message, _ = parse_form("\x1b[2J" + "y" * 10_000, {"type": "object", "properties": {}})
    assert len(message) <= 2001 and "\x1b" not in message


# -- the flow: a card in the originating notebook, answered there ------------------------------------

async def test_the_question_reaches_the_originating_notebook_and_its_answer_the_server(broker: Broker) -> None:
    """2026-07-28 (MCP SDK 2.3): the question arrives inside the call; only the run's kernel may answer."""
    router = router_of(broker)
    conn = McpConnection(StdioServerConfig(name="el", command=sys.executable, args=[str(HERE / "elicit_server.py")]),
                         connect_timeout=30.0, call_timeout=3.0)
    conn.elicitation_handler = router
    try:
        await conn.open()
        assert conn.protocol_version == "2026-07-28"
        with call_context(Ctx()):
            call = asyncio.create_task(conn.call_tool("ask_name", {}))
            request = await next_request(broker)
        assert request["server"] == "el" and request["tool"] == "el__ask_name" and request["from"] == "server"
        assert request["message"] == "Who are you?" and request["originator"] == "kernel:aaa"
        assert [f["name"] for f in request["fields"]] == ["name", "age"]
        assert events(broker, EventType.ELICITATION_REQUEST)[0].origin == ORIGIN  # only that notebook sees it
        rid = request["request_id"]
        for caller in (OTHER_KERNEL, SAME_NOTEBOOK_OTHER_CLIENT):
            with pytest.raises(RoutingRefusal) as info:
                router.answer(caller, rid, "accept", {"name": "Mallory"})
            assert info.value.code.value == "NOT_ORIGINATOR"
        with pytest.raises(RoutingRefusal) as info:  # a wrong answer leaves the question open
            router.answer(KERNEL, rid, "accept", {"age": "old"})
        assert info.value.code.value == "INVALID_ARGUMENTS"
        # the person took longer than the call's 3 s timeout to answer: their time is not the server's
        await asyncio.sleep(3.5)
        router.answer(KERNEL, rid, "accept", {"name": SECRET_VALUE, "age": 36})
        with pytest.raises(RoutingRefusal) as info:
            router.answer(KERNEL, rid, "decline")
        assert info.value.code.value == "CONFLICT"
        result = await call
    finally:
        await conn.close()
    assert result["content"] == f"accepted: {SECRET_VALUE} (36)"
    resolved = events(broker, EventType.ELICITATION_RESOLVED)
    assert [(e.data["action"], e.data["answered_by"], e.data["fields_answered"]) for e in resolved] == [
        ("accept", "kernel:aaa", ["age", "name"])]
    # what was typed went to the server only: not into an event or the audit
    stored = json.dumps([e.data for e in events(broker)]) + json.dumps([r.model_dump() for r in broker.audit.tail(50)])
    assert SECRET_VALUE not in stored
    audit = [r for r in broker.audit.tail(50) if r.tool.startswith("elicitation:")]
    assert [(r.tool, r.decision, r.answered_by, r.origin) for r in audit] == [
        ("elicitation:el__ask_name", "accept", "kernel:aaa", ORIGIN)]


async def test_no_answer_declines_and_the_call_goes_on(broker: Broker, tmp_path: Path) -> None:
    """A stalled card: the router's deadline declines; the server gets decline, never accept."""
    router = router_of(broker, timeout=1.0)
    conn = McpConnection(raw(tmp_path, NAME_FORM), connect_timeout=15.0, call_timeout=0.5)
    conn.elicitation_handler = router
    try:
        await conn.open()
        with call_context(Ctx()):
            result = await conn.call_tool("ask", {})
    finally:
        await conn.close()
    assert json.loads(result["content"]) == [{"action": "decline"}]
    resolved = events(broker, EventType.ELICITATION_RESOLVED)
    assert [(e.data["action"], e.data["answered_by"]) for e in resolved] == [("decline", "timeout")]
    assert [r.decision for r in broker.audit.tail(10) if r.tool.startswith("elicitation:")] == ["timeout"]


@pytest.mark.parametrize(("schema", "kind"), [
    ({"type": "object", "properties": {"username": {"type": "string"}, "password": {"type": "string"}}}, "secret"),
    ({"type": "object", "properties": {f"f{i}": {"type": "string", "description": "d" * 1000} for i in range(20)}},
     "limit"),
])
async def test_a_form_relay_will_not_show_is_declined_with_one_line_and_no_card(
        broker: Broker, tmp_path: Path, schema: dict[str, Any], kind: str) -> None:
    router = router_of(broker)
    conn = McpConnection(raw(tmp_path, schema), connect_timeout=15.0)
    conn.elicitation_handler = router
    try:
        await conn.open()
        with call_context(Ctx()):
            result = await conn.call_tool("ask", {})
    finally:
        await conn.close()
    assert json.loads(result["content"]) == [{"action": "decline"}]
    assert events(broker, EventType.ELICITATION_REQUEST) == []  # never shown
    (resolved,) = events(broker, EventType.ELICITATION_RESOLVED)
    assert resolved.origin == ORIGIN and resolved.data["refused_kind"] == kind and resolved.data["refused"]
    assert [(r.decision, r.arguments.get("refused")) for r in broker.audit.tail(10)
            if r.tool.startswith("elicitation:")] == [("refused", kind)]


async def test_a_server_that_keeps_asking_is_declined_after_the_limit(broker: Broker, tmp_path: Path) -> None:
    router = router_of(broker)
    conn = McpConnection(raw(tmp_path, NAME_FORM, "--elicit-count", str(MAX_PER_CALL + 3)), connect_timeout=15.0)
    conn.elicitation_handler = router

    async def answer_all() -> None:
        for seen in range(MAX_PER_CALL):
            request = await next_request(broker, seen)
            router.answer(KERNEL, request["request_id"], "decline")

    try:
        await conn.open()
        with call_context(Ctx()):
            answering = asyncio.create_task(answer_all())
            result = await conn.call_tool("ask", {})
            await answering
    finally:
        await conn.close()
    replies = json.loads(result["content"])
    assert replies == [{"action": "decline"}] * (MAX_PER_CALL + 3)
    assert len(events(broker, EventType.ELICITATION_REQUEST)) == MAX_PER_CALL  # the rest never reached anyone
    assert [e["kind"] for e in conn.elicitation_log] == ["limit"] * 3


async def test_a_question_that_cannot_be_tied_to_one_notebook_is_declined(broker: Broker, tmp_path: Path) -> None:
    """No call context (a call nobody attributed), or two calls in flight on one connection: declined,
    never routed to a guessed notebook."""
    router = router_of(broker)
    conn = McpConnection(raw(tmp_path, NAME_FORM, "--elicit-count", "1"), connect_timeout=15.0)
    conn.elicitation_handler = router
    try:
        await conn.open()
        result = await conn.call_tool("ask", {})  # no call_context
        assert json.loads(result["content"]) == [{"action": "decline"}]
        with call_context(Ctx()):
            # a second call (of another notebook) in flight on the same connection while the server asks
            conn._inflight[-1] = _InFlight(tool="raw__echo", context=Ctx(origin="notebook:b.ipynb"))
            try:
                result = await conn.call_tool("ask", {})
            finally:
                conn._inflight.pop(-1, None)
        assert json.loads(result["content"]) == [{"action": "decline"}]
    finally:
        await conn.close()
    assert events(broker, EventType.ELICITATION_REQUEST) == []
    assert [e["kind"] for e in conn.elicitation_log] == ["context", "context"]


async def test_a_kernel_restart_and_the_kill_switch_decline_open_questions(broker: Broker, tmp_path: Path) -> None:
    router = router_of(broker)
    conn = McpConnection(raw(tmp_path, NAME_FORM, "--elicit-count", "2"), connect_timeout=15.0)
    conn.elicitation_handler = router
    try:
        await conn.open()
        with call_context(Ctx()):
            call = asyncio.create_task(conn.call_tool("ask", {}))
            first = await next_request(broker)
            assert router.withdraw(originator="kernel:aaa", reason="restarted") == [first["request_id"]]
            await next_request(broker, 1)
            assert router.decline_all(ORIGIN) == 1
            result = await call
    finally:
        await conn.close()
    assert json.loads(result["content"]) == [{"action": "decline"}, {"action": "decline"}]
    with pytest.raises(RoutingRefusal) as info:
        router.answer(KERNEL, first["request_id"], "accept", {"name": "late"})
    assert info.value.code.value == "CONFLICT"


@pytest.mark.peer
async def test_an_mcp_sdk_1_12_server_asks_through_the_card(broker: Broker) -> None:
    """2025-06-18 (MCP SDK 1.12): the question is a server-to-client request during the call."""
    router = router_of(broker)
    conn = McpConnection(old_server("old", "1.12"), connect_timeout=30.0)
    conn.elicitation_handler = router
    try:
        await conn.open()
        assert conn.protocol_version == "2025-06-18"
        with call_context(Ctx()):
            call = asyncio.create_task(conn.call_tool("ask_name", {}))
            request = await next_request(broker)
            router.answer(KERNEL, request["request_id"], "accept", {"name": "Grace"})
            assert (await call)["content"] == "accepted: Grace (30)"
            secret = await conn.call_tool("ask_password", {})
    finally:
        await conn.close()
    assert secret["content"] == "answer: decline"
    assert len(events(broker, EventType.ELICITATION_REQUEST)) == 1  # the password form never became a card


async def test_elicitation_answer_over_rpc_follows_the_addressee_rule(broker: Broker) -> None:
    from relay_jupyter.broker.elicitations import router_of
    from relay_jupyter.mcp.elicitation import ElicitationAsk

    router = router_of(broker)
    assert router_of(broker) is router
    _message, fields = parse_form("Who?", NAME_FORM)
    asking = asyncio.create_task(router(ElicitationAsk(server="s", message="Who?", fields=fields, context=Ctx(),
                                                       tool="s__t")))
    request = await next_request(broker)

    async def rpc(caller: Caller, method: str, params: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        return json.loads(await broker.dispatch(caller, body))

    pending = await rpc(KERNEL, "elicitation.pending", {})
    assert [r["request_id"] for r in pending["result"]["requests"]] == [request["request_id"]]
    assert (await rpc(OTHER_KERNEL, "elicitation.pending", {}))["result"]["requests"] == []
    refused = await rpc(OTHER_KERNEL, "elicitation.answer", {"request_id": request["request_id"], "action": "accept",
                                                             "content": {"name": "Mallory"}})
    assert refused["error"]["data"]["code"] == "NOT_ORIGINATOR"
    bad = await rpc(KERNEL, "elicitation.answer", {"request_id": request["request_id"], "action": "yes"})
    assert bad["error"]["code"] == -32602
    ok = await rpc(KERNEL, "elicitation.answer", {"request_id": request["request_id"], "action": "accept",
                                                  "content": {"name": "Ada"}})
    assert ok["result"] == {"request_id": request["request_id"], "action": "accept", "answered_by": "kernel:aaa"}
    answer = await asking
    assert (answer.action, answer.content) == ("accept", {"name": "Ada"})
