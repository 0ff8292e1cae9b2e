"""The panel's lists filtered in the store, not among the newest rows (issue 15 leftover; docs/protocol.md
``runs.list`` / ``audit.tail`` / ``telemetry.query``): ``origin_prefix`` (a notebook folder, or on a hub the user's ``user:<name>/``, a hub
panel's default), ``tool`` and ``decision`` are applied while the runs table or the audit log is read, so a filter
finds rows older than the newest 1000 (before, a hub panel picked its user's rows from the service's newest 1000 and
a filter in the panel from what it had been sent). A panel asking another user's prefix is refused.

A real broker on a SQLite data dir (the journal's SQL and the JSON-lines audit log) and the in-memory store, no hub.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Refusal
from relay_jupyter.core.types import AuditRecord

A_NB, A_DIR_NB, B_NB = "user:alice/notebook:a.ipynb", "user:alice/notebook:reports/q4.ipynb", "user:bob/notebook:b.ipynb"
BOBS = 1_100  # more than the lists' maximum (1000): alice's rows are all older than the newest 1000


def panel(user: str) -> Caller:
    return Caller(kind=CallerKind.PANEL, origin=None, client_id=f"user:{user}/#panel:default", user=user,
                  origin_prefix=f"user:{user}/")


BROWSER = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:u:default", user="u")


def _record(origin: str, tool: str, decision: str) -> AuditRecord:
    return AuditRecord(ts=time.time(), origin=origin, tool=tool, decision=decision, answered_by="test", arguments={})


@pytest.mark.parametrize("in_memory", [False, True], ids=["sqlite", "memory"])
def test_filters_find_rows_older_than_the_newest_thousand(tmp_path, in_memory: bool) -> None:
    async def go() -> None:
        broker = Broker.open(BrokerConfig(in_memory=True) if in_memory else BrokerConfig(data_dir=tmp_path / "relay"))
        try:
            broker.store.run_started("run-a", A_NB, "c1", {"originator": "x"})
            broker.store.run_started("run-q4", A_DIR_NB, "c1", {"originator": "x"})
            broker.audit.append(_record(A_NB, "run_code", "deny"))
            broker.audit.append(_record(A_DIR_NB, "scratch_read", "allow"))
            for origin in (A_NB, A_DIR_NB):
                broker.telemetry.record(origin=origin, model="claude-test-1", source="proxy")
            for n in range(BOBS):  # bob's newer rows, also of the same tools and decisions
                broker.store.run_started(f"bob-{n}", B_NB, "c1", {"originator": "x"})
                broker.telemetry.record(origin=B_NB, model="claude-test-1", source="proxy")
                broker.audit.append(_record(B_NB, "run_code" if n % 2 else "scratch_read", "deny" if n % 3 else "allow"))
            alice = panel("alice")
            # a hub panel: her rows, found in the store under her prefix (its default), however many of bob's are newer
            runs = (await call_method(broker, alice, "runs.list", {"limit": 5}))["runs"]
            assert [r["run_id"] for r in runs] == ["run-q4", "run-a"]
            audit = (await call_method(broker, alice, "audit.tail", {"n": 5}))["records"]
            assert [(r["origin"], r["tool"]) for r in audit] == [(A_NB, "run_code"), (A_DIR_NB, "scratch_read")]
            rows = (await call_method(broker, alice, "telemetry.query", {}))["rows"]  # the default limit: 1000
            assert [r["origin"] for r in rows] == [A_NB, A_DIR_NB]
            rows = (await call_method(broker, alice, "telemetry.query", {"origin_prefix": "user:alice/notebook:reports/",
                                                                         "limit": 1}))["rows"]
            assert [r["origin"] for r in rows] == [A_DIR_NB]
            # a notebook folder under her prefix, a tool, a decision
            only_dir = (await call_method(broker, alice, "runs.list", {"origin_prefix": "user:alice/notebook:reports/"}))
            assert [r["run_id"] for r in only_dir["runs"]] == ["run-q4"]
            denied = (await call_method(broker, alice, "audit.tail", {"decision": "deny"}))["records"]
            assert [(r["origin"], r["tool"]) for r in denied] == [(A_NB, "run_code")]
            reads = (await call_method(broker, alice, "audit.tail", {"tool": "scratch_read", "n": 1000}))["records"]
            assert [r["origin"] for r in reads] == [A_DIR_NB]
            # never another user's: a prefix outside hers is refused, look-alikes included
            for foreign in ("user:bob/", "user:alicex/", "user:", "notebook:", "user:alic"):
                for method, key in (("runs.list", "origin_prefix"), ("audit.tail", "origin_prefix"),
                                    ("telemetry.query", "origin_prefix")):
                    with pytest.raises(Refusal) as err:
                        await call_method(broker, alice, method, {key: foreign})
                    assert err.value.code.value == "UNAUTHORIZED", (method, foreign)
            # a single-user server's browser session: every origin, and the same filters in the store
            newest = (await call_method(broker, BROWSER, "audit.tail", {"n": 1000}))["records"]
            assert {r["origin"] for r in newest} == {B_NB}  # alice's are older than the newest 1000
            found = (await call_method(broker, BROWSER, "audit.tail", {"origin_prefix": "user:alice/", "n": 10}))
            assert {r["origin"] for r in found["records"]} == {A_NB, A_DIR_NB}
            bob_allows = (await call_method(broker, BROWSER, "audit.tail",
                                            {"origin_prefix": "user:bob/", "tool": "scratch_read", "decision": "allow",
                                             "n": 1000}))["records"]
            expected = sum(1 for n in range(BOBS) if n % 2 == 0 and n % 3 == 0)
            assert len(bob_allows) == expected and all(r["tool"] == "scratch_read" and r["decision"] == "allow"
                                                       for r in bob_allows)
            rows = (await call_method(broker, BROWSER, "telemetry.query", {"origin_prefix": "user:alice/", "limit": 5}))
            assert [r["origin"] for r in rows["rows"]] == [A_NB, A_DIR_NB]
            assert {r["origin"] for r in (await call_method(broker, BROWSER, "telemetry.query", {}))["rows"]} == {B_NB}
            runs = (await call_method(broker, BROWSER, "runs.list", {"origin_prefix": "user:alice/", "limit": 1000}))
            assert [r["run_id"] for r in runs["runs"]] == ["run-q4", "run-a"]
            # a prefix with LIKE's wildcards matches itself only
            assert (await call_method(broker, BROWSER, "runs.list", {"origin_prefix": "user:%/"}))["runs"] == []
            # a kernel's filter stays inside its own origin
            kernel = Caller(kind=CallerKind.DAEMON, origin=A_NB, client_id="user:alice/kernel:a.ipynb", user="alice")
            assert (await call_method(broker, kernel, "runs.list", {"origin_prefix": "user:"}))["runs"][0]["origin"] \
                == A_NB
            assert (await call_method(broker, kernel, "audit.tail", {"tool": "scratch_read"}))["records"] == []
            assert {r["origin"] for r in (await call_method(broker, kernel, "telemetry.query",
                                                            {"origin_prefix": "user:"}))["rows"]} == {A_NB}
        finally:
            broker.close()

    asyncio.run(go())
