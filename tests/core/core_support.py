"""Helpers for the core tests: a settable clock and a gate over the in-memory ports (unique module name:
pytest imports test helpers by basename)."""

from __future__ import annotations

from dataclasses import dataclass

from relay_jupyter.core.budgets import BudgetLedger
from relay_jupyter.core.gate import Gate
from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.memory import MemoryAuditSink, MemoryGrantStore, MemoryLedger
from relay_jupyter.core.pricing import Pricing


class FakeClock:
    """A clock tests move by hand (epoch-like seconds)."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Rig:
    clock: FakeClock
    mono: FakeClock
    store: MemoryGrantStore
    book: GrantBook
    ledger_port: MemoryLedger
    ledger: BudgetLedger
    audit: MemoryAuditSink
    pricing: Pricing
    gate: Gate


def make_rig(*, consent_timeout: float = 5.0, pricing: Pricing | None = None) -> Rig:
    clock, mono = FakeClock(), FakeClock(1000.0)
    store = MemoryGrantStore()
    book = GrantBook(store, clock, monotonic=mono, cache_ttl=0)
    ledger_port = MemoryLedger()
    ledger = BudgetLedger(ledger_port, clock=clock, monotonic=mono)
    audit = MemoryAuditSink()
    pricing = pricing or Pricing()
    gate = Gate(grants=book, ledger=ledger, audit=audit, pricing=pricing, clock=clock,
                consent_timeout=consent_timeout)
    return Rig(clock, mono, store, book, ledger_port, ledger, audit, pricing, gate)


