"""The hub user's side panel (Caller kind ``panel``) without a hub: one origin-prefix rule, applied by every
access rule, list method, router and the event bus (its index and its replay). The hub tests
(test_hub_panel.py) drive the same through a real hub, service and thin server over HTTP."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.events import can_see
from relay_jupyter.broker.methods._access import PANEL_FILTERED, Scope
from relay_jupyter.broker.permissions import may_act_for
from relay_jupyter.broker.registry import METHODS
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import GateRefusal, Refusal
from relay_jupyter.core.types import Event

A_NB, B_NB = "user:alice/notebook:a.ipynb", "user:bob/notebook:b.ipynb"


def panel(user: str) -> Caller:
    return Caller(kind=CallerKind.PANEL, origin=None, client_id=f"user:{user}/#panel:default", user=user,
                  origin_prefix=f"user:{user}/")


def kernel(origin: str) -> Caller:
    user = origin.split("/", 1)[0].removeprefix("user:")
    return Caller(kind=CallerKind.DAEMON, origin=origin, client_id=f"user:{user}/kernel:x", user=user)


def test_a_panel_acts_for_its_users_origins_only() -> None:
    alice = panel("alice")
    for mine in (A_NB, "user:alice/client:default", "user:alice/notebook:dir/x.ipynb"):
        assert alice.acts_for(mine) and may_act_for(alice, mine), mine
    for other in (B_NB, "user:alicex/notebook:a.ipynb", "user:ali/notebook:a.ipynb", "user:alice", "notebook:a.ipynb",
                  "daemon:alice", "*", "", None, "USER:alice/notebook:a.ipynb"):
        assert not alice.acts_for(other) and not may_act_for(alice, other), other
    assert can_see(alice, Event(id=1, ts=0, type="run.started", origin=None, run_id=None, data={}))  # broadcasts


@pytest.mark.parametrize("bad", [
    {"origin_prefix": None}, {"origin_prefix": "user:alice"}, {"origin_prefix": "user:alice/x/"},
    {"origin_prefix": "user:alice/", "origin": A_NB}, {"origin_prefix": "user:alice/", "stops_all": True},
])
def test_a_panel_caller_without_exactly_one_user_prefix_cannot_be_built(bad) -> None:
    with pytest.raises(ValidationError):
        Caller(**{"kind": CallerKind.PANEL, "origin": None, "client_id": "p", **bad})
    with pytest.raises(ValidationError):  # and no other caller carries a prefix
        Caller(kind=CallerKind.DAEMON, origin=A_NB, client_id="k", origin_prefix="user:alice/")


def test_every_method_keeps_a_panel_inside_its_users_origins() -> None:
    """For every registered method: naming another user's origin is refused; naming none reaches only a handler
    that filters (PANEL_FILTERED), anything else is refused (fail closed for a method added later)."""
    alice = panel("alice")
    checked = 0
    for name, spec in METHODS.items():
        if spec.access is None:
            continue
        scope = Scope(spec.scope)
        fields = spec.params.model_fields
        if "origin" in fields:
            theirs = spec.params.model_construct(origin=B_NB, **({"all": False} if "all" in fields else {}))
            try:
                got = spec.access.origin(alice, theirs, scope)
            except GateRefusal:
                got = "refused"
            assert got == "refused" or (got is None and name in PANEL_FILTERED), (name, got)
            mine = spec.params.model_construct(origin=A_NB, **({"all": False} if "all" in fields else {}))
            assert spec.access.origin(alice, mine, scope) in (A_NB, None), name
        if "all" in fields:
            with pytest.raises(GateRefusal):
                spec.access.origin(alice, spec.params.model_construct(all=True, origin=None), scope)
        checked += 1
    assert checked > 30
    assert "kernel.ended" not in PANEL_FILTERED and "mcp.sign_in" not in PANEL_FILTERED


def test_list_methods_answer_a_panel_with_its_users_rows_only(tmp_path) -> None:
    from relay_jupyter.broker.assembly import install_components

    async def go() -> None:
        broker = Broker.open(BrokerConfig(in_memory=True))
        install_components(broker, jupyter_root=tmp_path)
        try:
            for origin in (A_NB, B_NB, "notebook:single.ipynb"):
                await call_method(broker, kernel(origin) if origin.startswith("user:") else
                                  Caller(kind=CallerKind.KERNEL, origin=origin, client_id="kernel:k"),
                                  "grants.create", {"tools": ["*"], "models": ["*"]})
                broker.store.run_started(f"run-{origin[-7:]}", origin, "c1", {"originator": "x"})
                broker.store.add_trust(origin, "", "run_code", "d")
            alice = panel("alice")
            grants = (await call_method(broker, alice, "grants.list", {}))["grants"]
            assert [g["origin"] for g in grants] == [A_NB]
            assert {r["origin"] for r in (await call_method(broker, alice, "runs.list", {}))["runs"]} == {A_NB}
            assert {r["origin"] for r in (await call_method(broker, alice, "trust.list", {}))["trust"]} == {A_NB}
            audit = (await call_method(broker, alice, "audit.tail", {"n": 100}))["records"]
            assert audit and {r["origin"] for r in audit} == {A_NB}, audit
            for method, params in (("runs.get", {"run_id": "run-b.ipynb"}), ("runs.cancel", {"run_id": "run-b.ipynb"}),
                                   ("grants.revoke", {"origin": B_NB}), ("audit.tail", {"origin": B_NB}),
                                   ("budget.get", {"origin": B_NB}), ("kill", {"all": True}),
                                   ("kill", {"origin": B_NB}), ("kernel.ended", {"reason": "restarted"}),
                                   ("grants.get", {})):
                with pytest.raises(Refusal) as err:
                    await call_method(broker, alice, method, params)
                assert err.value.code.value in ("UNAUTHORIZED", "NOT_FOUND"), (method, err.value)
            assert (await call_method(broker, alice, "runs.get", {"run_id": "run-a.ipynb"}))["run"]["origin"] == A_NB
            browser = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:u:default", user="u")
            # bob's newer rows do not crowd hers out of a short list (up to the method's maximum of the service's)
            for n in range(150):
                broker.store.run_started(f"bob-{n}", B_NB, "c1", {"originator": "x"})
                await call_method(broker, kernel(B_NB), "grants.get", {})
                await call_method(broker, kernel(B_NB), "audit.tail", {"n": 1})
                await call_method(broker, kernel(B_NB), "trust.revoke", {})
            assert [r["run_id"] for r in (await call_method(broker, alice, "runs.list", {"limit": 5}))["runs"]] \
                == ["run-a.ipynb"]
            newest = (await call_method(broker, browser, "audit.tail", {"n": 20}))["records"]
            assert {r["origin"] for r in newest} == {B_NB}, newest  # bob's are the service's newest
            short = (await call_method(broker, alice, "audit.tail", {"n": 1}))["records"]
            assert len(short) == 1 and short[0]["origin"] == A_NB, short
            assert (await call_method(broker, alice, "budget.get", {"origin": A_NB})) is not None
            # a browser session of a single-user server still sees every origin of its server
            assert len((await call_method(broker, browser, "grants.list", {}))["grants"]) == 3
        finally:
            broker.close()

    asyncio.run(go())


def test_the_event_bus_delivers_and_replays_a_panel_its_users_events_only() -> None:
    async def go() -> None:
        broker = Broker.open(BrokerConfig(in_memory=True))
        bus = broker.events
        try:
            alice, bob = panel("alice"), panel("bob")
            sa, sb = bus.subscribe(alice, maxsize=100), bus.subscribe(bob, maxsize=100)
            sk = bus.subscribe(kernel(A_NB), maxsize=100)
            for origin in (A_NB, B_NB, "user:alicex/notebook:a.ipynb", "notebook:x.ipynb", None):
                bus.append("run.started", {"who": origin}, origin=origin, run_id=None)
            bus.flush()

            def origins(sub) -> list:
                return [json.loads(f.split(b"\ndata: ", 1)[1])["origin"] for _, f in sub.drain()]

            assert origins(sa) == [A_NB, None] and origins(sb) == [B_NB, None] and origins(sk) == [A_NB, None]
            for who, want in ((alice, [A_NB, None]), (bob, [B_NB, None])):
                since, seen = 0, []
                while True:
                    since, frames, done = bus.replay_frames(who, since, limit=2)  # pages with nothing of theirs too
                    if done:
                        break
                    seen += [json.loads(chunk.split(b"\n\n", 1)[0])["origin"]
                             for chunk in frames.split(b"\ndata: ")[1:]]
                assert seen == want, (who.user, seen)
            bus.unsubscribe(sa)
            bus.append("run.started", {}, origin=A_NB, run_id=None)
            bus.flush()
            assert origins(sk) == [A_NB] and not bus._by_prefix.get("user:alice/")
        finally:
            broker.close()

    asyncio.run(go())
