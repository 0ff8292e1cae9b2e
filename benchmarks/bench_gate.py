"""A gate decision: a granted read tool through ``Gate.call_tool``, with and without an audit append.

No target: a decision is microseconds inside a model request that takes seconds, so the issue 2
target (< 5 µs) was dropped with the optimisations it had bought (hand-built pydantic records, issue 18
item 6 and 14.7). The rows stay as a watch on regressions. Baseline: a bare ``dict`` lookup plus a
function call. Median of several rounds, per operation, in process CPU time.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from relay_jupyter.core.budgets import BudgetLedger
from relay_jupyter.core.consent import StaticConsent
from relay_jupyter.core.gate import Gate
from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.memory import MemoryAuditSink, MemoryGrantStore, MemoryLedger
from relay_jupyter.core.pricing import Pricing
from relay_jupyter.core.types import AuditRecord, Budget, Grant, ToolClass, ToolRequest, ToolSpec, Usage

# CPU time of this process (the audit log's fsync thread included): on a shared machine wall time
# mostly measures the other tenants. Median of ROUNDS rounds.
_now = time.process_time_ns
N = 10_000
ROUNDS = 5


class NullSink:
    """An audit sink that drops records: the gate's own cost without an append."""

    def append(self, record: AuditRecord) -> AuditRecord:
        return record

    def tail(self, n: int = 100, *, origin: str | None = None) -> list[AuditRecord]:
        return []


class RingSink(MemoryAuditSink):
    """In-memory sink that keeps memory flat over a long benchmark."""

    def append(self, record: AuditRecord) -> AuditRecord:
        stored = super().append(record)
        if len(self._records) > 1024:
            del self._records[:512]
        return stored


def baseline_ns() -> float:
    table = {f"tool{i}": i for i in range(64)}

    def decide(name: str) -> int | None:
        return table.get(name)

    rounds = []
    for _ in range(ROUNDS):
        t0 = _now()
        for _ in range(N):
            decide("tool7")
        rounds.append((_now() - t0) / N)
    return statistics.median(rounds)


def make_gate(audit) -> Gate:
    book = GrantBook(MemoryGrantStore())
    book.issue(Grant(origin="notebook:a.ipynb#k", tools=frozenset({"scratch_read"}), models=frozenset({"*"}),
                     consent_id="c", budget=Budget(requests_per_minute=None, tokens_per_day=None,
                                                   cost_per_day_usd=None)))
    return Gate(grants=book, ledger=BudgetLedger(MemoryLedger()), audit=audit, pricing=Pricing())


def tool_call_ns(gate: Gate) -> float:
    req = ToolRequest(origin="notebook:a.ipynb#k", tool=ToolSpec(name="scratch_read", tool_class=ToolClass.READ),
                      call_id="c1", run_id="r1", arguments={"path": "data/a.csv", "max_bytes": 4096})
    consent = StaticConsent("deny")

    async def execute() -> str:
        return "ok"

    async def rounds() -> float:
        times = []
        for _ in range(ROUNDS):
            t0 = _now()
            for _ in range(N):
                await gate.call_tool(req, execute, consent)
            times.append((_now() - t0) / N)
        return statistics.median(times)

    return asyncio.run(rounds())


def completion_ns(gate: Gate) -> float:
    usage = Usage(input_tokens=1200, output_tokens=300)
    times = []
    for _ in range(ROUNDS):
        t0 = _now()
        for _ in range(N // 4):
            res = gate.begin_completion("notebook:a.ipynb#k", "claude-sonnet-4-5", estimated_tokens=4000)
            gate.settle_completion(res, "claude-sonnet-4-5", usage)
        times.append((_now() - t0) / (N // 4))
    return statistics.median(times)


def run(report) -> None:
    """Report gate decision cost against a dict lookup + call."""
    base = baseline_ns()
    report("gate decision, no audit append", tool_call_ns(make_gate(NullSink())), base, "ns")
    report("gate decision, in-memory audit", tool_call_ns(make_gate(RingSink())), base, "ns")
    try:
        from relay_jupyter.storage.audit_log import AuditLog
    except ImportError:
        return
    with tempfile.TemporaryDirectory() as tmp:
        log = AuditLog(Path(tmp) / "audit.jsonl", max_bytes=None)
        try:
            report("gate decision, JSON-lines audit (flushed, fsync batched)", tool_call_ns(make_gate(log)),
                   base, "ns")
            report("model request begin+settle, JSON-lines audit (2 lines)", completion_ns(make_gate(log)),
                   base, "ns")
        finally:
            log.close()
