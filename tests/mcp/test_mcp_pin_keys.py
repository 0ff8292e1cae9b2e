"""Pins and saved trust are keyed by ``(server, tool)`` (and origin), never a joined ``server__tool``
(issue 11 item 8).

With the ``__`` joiner, server ``a_`` + tool ``x`` and server ``a`` + tool ``_x`` are both ``a___x``; server
``a__b`` + tool ``c`` and server ``a`` + tool ``b__c`` are both ``a__b__c``. The tests below give the two
tools of each pair the *same* joined name, source and schema (so the same digest and identity): only the
server differs. A pin or "Always allow" given to one must not apply to the other, in every store; the
config refuses a server name that could make such a pair; an old file's joined rows are split as the
registry routed them.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.memory import MemoryStore
from relay_jupyter.core.types import (
    ConsentDecision,
    ConsentRequest,
    ConsentScope,
    ToolClass,
    ToolRequest,
    ToolSpec,
)
from relay_jupyter.mcp.config import parse_config
from relay_jupyter.mcp.discovery import qualified_name, split_name
from relay_jupyter.mcp.pins import PinBook
from relay_jupyter.runtime.tools import tool_identity
from relay_jupyter.storage.schema import MIGRATIONS, migrate
from relay_jupyter.storage.sqlite import Store

KERNEL = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb", client_id="kernel:aaa")
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}


def _spec(server: str, tool: str) -> ToolSpec:
    return ToolSpec(name=qualified_name(server, tool), server=server, source="same-command --flag",
                    description="deletes a file", input_schema=SCHEMA)


# (the tool pinned / trusted, the tool that must not inherit it): same joined name, digest and identity
PAIRS = [(_spec("a_", "x"), _spec("a", "_x")), (_spec("a__b", "c"), _spec("a", "b__c"))]


def test_the_pairs_really_collide_when_joined() -> None:
    for first, second in PAIRS:
        assert first.name == second.name and first.digest == second.digest
        assert tool_identity(first) == tool_identity(second)
        assert first.key != second.key


@pytest.fixture(params=["memory", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        yield MemoryStore()
        return
    s = Store.open(tmp_path / "relay.db")
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize(("pinned", "other"), PAIRS, ids=["a_+x vs a+_x", "a__b+c vs a+b__c"])
def test_a_pin_never_applies_to_another_server_whose_joined_name_collides(any_store, pinned, other) -> None:
    book = PinBook(any_store)
    book.pin(pinned, "read")
    assert book.resolve(pinned) is ToolClass.READ
    assert book.resolve(other) is None, "another server's tool inherited the pin"
    # resolving the other (same digest) never deletes or rewrites the pinned one's row
    assert book.resolve(pinned) is ToolClass.READ
    book.pin(other, "write")
    assert book.resolve(pinned) is ToolClass.READ and book.resolve(other) is ToolClass.WRITE
    assert book.unpin(*other.key) is True and book.resolve(pinned) is ToolClass.READ
    assert [(p["server"], p["tool"]) for p in book.list()] == [pinned.key]


@pytest.mark.asyncio
@pytest.mark.parametrize(("trusted", "other"), PAIRS, ids=["a_+x vs a+_x", "a__b+c vs a+b__c"])
async def test_always_allow_never_answers_for_another_server_whose_joined_name_collides(trusted, other) -> None:
    broker = Broker.open(BrokerConfig(in_memory=True, consent_timeout=2.0, kernel_tool_timeout=2.0))
    try:
        router = broker.permissions

        def ask(rid: str, spec: ToolSpec, run_id: str):
            req = ToolRequest(origin=KERNEL.origin, tool=spec, arguments={"path": "p"}, call_id=rid,
                              run_id=run_id, originator=KERNEL.client_id)
            return router.ask(ConsentRequest(request_id=rid, request=req, deadline=time.time() + 30))

        async def answered(rid: str, spec: ToolSpec, run_id: str, scope: ConsentScope, decision: ConsentDecision):
            task = asyncio.create_task(ask(rid, spec, run_id))
            async with asyncio.timeout(5):
                while rid not in router._pending:
                    await asyncio.sleep(0)
            router.answer(KERNEL, rid, decision, scope)
            return await task

        first = await answered("pr_1", trusted, "run1", ConsentScope.NOTEBOOK, ConsentDecision.ALLOW)
        assert first.decision is ConsentDecision.ALLOW
        assert [(r["server"], r["tool"]) for r in broker.store.list_trust()] == [trusted.key]
        again = await ask("pr_2", trusted, "run2")
        assert again.answered_by == "trust:notebook"  # the trust works for the tool it was given to
        # the colliding tool of another server is asked about (a card), and denying it leaves the trust alone
        result = await answered("pr_3", other, "run3", ConsentScope.ONCE, ConsentDecision.DENY)
        assert result.decision is ConsentDecision.DENY and result.answered_by != "trust:notebook"
        # a run allow is keyed the same way: allowing `other` for run4 does not allow `trusted`'s twin ...
        await answered("pr_4", other, "run4", ConsentScope.RUN, ConsentDecision.ALLOW)
        assert (await ask("pr_5", other, "run4")).answered_by == "scope:run"
        broker.store.revoke_trust(KERNEL.origin)
        # ... and the run allow of `other` does not answer for `trusted` in that run
        task = asyncio.create_task(ask("pr_6", trusted, "run4"))
        async with asyncio.timeout(5):
            while "pr_6" not in router._pending:
                await asyncio.sleep(0)
        router.answer(KERNEL, "pr_6", ConsentDecision.DENY, ConsentScope.ONCE)
        assert (await task).decision is ConsentDecision.DENY
    finally:
        broker.close()


@pytest.mark.asyncio
async def test_trust_revoke_by_the_models_name_removes_only_what_that_name_routes_to() -> None:
    broker = Broker.open(BrokerConfig(in_memory=True))
    try:
        import json

        origin = KERNEL.origin
        broker.store.add_trust(origin, "a_", "x", "d")   # joins to a___x, but a___x routes to (a, _x)
        broker.store.add_trust(origin, "a", "_x", "d")
        broker.store.add_trust(origin, "", "write_file", "d")

        async def rpc(method: str, params: dict) -> dict:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
            return json.loads(await broker.dispatch(KERNEL, body))

        listed = (await rpc("trust.list", {}))["result"]["trust"]
        assert sorted((r["server"], r["tool"], r["name"]) for r in listed) == [
            ("", "write_file", "write_file"), ("a", "_x", "a___x"), ("a_", "x", "a___x")]
        assert (await rpc("trust.revoke", {"tool": "a___x"}))["result"]["revoked"] is True
        assert sorted((r["server"], r["tool"]) for r in broker.store.list_trust()) == [("", "write_file"),
                                                                                        ("a_", "x")]
        assert (await rpc("trust.revoke", {"tool": "x", "server": "a_"}))["result"]["revoked"] is True
        assert [(r["server"], r["tool"]) for r in broker.store.list_trust()] == [("", "write_file")]
    finally:
        broker.close()


def test_a_server_name_that_could_join_into_another_servers_tool_name_is_refused() -> None:
    cfg = parse_config('{"mcpServers": {"a_": {"command": "x"}, "a": {"command": "x"}, "a__b": {"command": "x"},'
                       ' "a_b": {"command": "x"}}}')
    assert set(cfg.servers) == {"a", "a_b"}
    assert "no '_' at the end" in cfg.problems["a_"] and "'__'" in cfg.problems["a__b"]
    # for every name the config accepts, <server>__<tool> splits back into exactly (server, tool)
    for server in cfg.servers:
        for tool in ("x", "_x", "__x", "b__c", "x_"):
            assert split_name(qualified_name(server, tool)) == (server, tool)


def test_an_old_file_with_joined_names_is_split_as_the_registry_routed_them(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, [step for step in MIGRATIONS if step[0] <= 6])
    conn.execute("INSERT INTO trust VALUES ('o', 'srv__write', 'd1', 0)")
    conn.execute("INSERT INTO trust VALUES ('o', 'scratch_push', 'd2', 0)")
    conn.execute("INSERT INTO trust VALUES ('o', 'a___x', 'd3', 0)")
    conn.execute("INSERT INTO pins VALUES ('srv__read_thing', 'd4', 'read', 0)")
    conn.execute("INSERT INTO pins VALUES ('a__b__c', 'd5', 'read', 0)")
    conn.execute("INSERT INTO pins VALUES ('not_namespaced', 'd6', 'read', 0)")
    conn.close()
    with Store.open(path) as s:
        assert [(r["server"], r["tool"], r["digest"]) for r in s.list_trust("o")] == [
            ("", "scratch_push", "d2"), ("a", "_x", "d3"), ("srv", "write", "d1")]
        assert [(p["server"], p["tool"], p["digest"]) for p in s.list_pins()] == [
            ("a", "b__c", "d5"), ("srv", "read_thing", "d4")]  # a pin that named no server is dropped
        assert s.has_trust("o", "srv", "write", "d1") and s.get_pin("srv", "read_thing") == ("d4", ToolClass.READ)
