"""Budgets: requests per minute, tokens and cost per origin per UTC day, caps per run.

Day budgets work by *reserve before, settle after*. Before a model request is sent, the
worst case (estimated tokens, priced at the model's highest rate) is held against the day's
limit; the check and the hold happen under one lock, so concurrent requests can never
together overspend what was free. After the response, :meth:`Reservation.settle` commits the
*actual* usage to the ledger — even when it exceeds the estimate, so the ledger never
under-counts — and frees the hold. :meth:`Reservation.release` frees a hold for a request
that was never sent.

Holds live in memory: after a restart nothing is outstanding, which is right because the
requests they covered died with the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from .errors import Code, GateRefusal
from .ports import Ledger
from .types import Grant

__all__ = ["BudgetLedger", "Reservation", "RunBudget", "TokenBucket", "utc_day"]


def utc_day(ts: float) -> str:
    """ISO date (UTC) of epoch seconds ``ts``: the ledger's day key."""
    return datetime.fromtimestamp(ts, UTC).date().isoformat()


def _check_amount(tokens: int, cost_usd: float) -> None:
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise ValueError("tokens must be a non-negative int")
    if not isinstance(cost_usd, (int, float)) or isinstance(cost_usd, bool) or not cost_usd >= 0 \
            or cost_usd == float("inf"):
        raise ValueError("cost_usd must be a finite non-negative number")


class TokenBucket:
    """A token bucket refilled at ``rate_per_minute``; holds at most ``capacity`` (default: one
    minute's worth, at least 1). Starts full. Not locked itself: :class:`BudgetLedger` locks."""

    __slots__ = ("_clock", "_last", "_tokens", "capacity", "rate")

    def __init__(self, rate_per_minute: float, *, capacity: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate_per_minute > 0:
            raise ValueError("rate_per_minute must be positive")
        self.rate = float(rate_per_minute)
        self.capacity = float(capacity) if capacity is not None else max(1.0, self.rate)
        self._tokens = self.capacity
        self._clock = clock
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._last
        if elapsed > 0:
            self._tokens = min(self.capacity, self._tokens + elapsed * self.rate / 60.0)
        self._last = now

    def available(self) -> float:
        """Requests that could be taken right now."""
        self._refill()
        return self._tokens

    def try_take(self, n: float = 1.0) -> bool:
        """Take ``n`` if there are that many; True when taken."""
        self._refill()
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False

    def resize(self, rate_per_minute: float) -> None:
        """Follow a new limit, keeping what was *used*: the requests made recently (``capacity -
        available``, as refilled at the old rate up to now) count against the new capacity, clamped
        to empty. So a wider limit gives only the difference at once, a narrower one never refills,
        and the same limit changes nothing (see docs/gate.md §6, "Rate").

        Raises:
            ValueError: ``rate_per_minute`` is not positive.
        """
        if not rate_per_minute > 0:
            raise ValueError("rate_per_minute must be positive")
        self._refill()
        used = self.capacity - self._tokens
        self.rate = float(rate_per_minute)
        self.capacity = max(1.0, self.rate)
        self._tokens = min(self.capacity, max(0.0, self.capacity - used))

    def retry_after(self, n: float = 1.0) -> float:
        """Seconds until ``n`` could be taken."""
        self._refill()
        missing = n - self._tokens
        return 0.0 if missing <= 0 else missing * 60.0 / self.rate


class Reservation:
    """A hold on an origin's day budget. Settle it or release it exactly once (repeats are no-ops)."""

    __slots__ = ("_book", "_done", "cost_usd", "day", "origin", "tokens")

    def __init__(self, book: BudgetLedger, origin: str, day: str, tokens: int, cost_usd: float) -> None:
        self._book = book
        self.origin = origin
        self.day = day
        self.tokens = tokens
        self.cost_usd = cost_usd
        self._done = False

    @property
    def done(self) -> bool:
        """True once settled or released."""
        return self._done

    def settle(self, tokens: int, cost_usd: float) -> None:
        """Commit the ACTUAL usage (may exceed the hold: never under-count) and free the hold.

        Raises:
            ValueError: a negative or non-numeric amount.
        """
        _check_amount(tokens, cost_usd)
        self._book._finish(self, tokens, float(cost_usd))

    def release(self) -> None:
        """Free the hold without committing anything (the request was never sent)."""
        self._book._finish(self, None, None)

    def __repr__(self) -> str:
        return f"Reservation({self.origin!r}, {self.day}, tokens={self.tokens}, cost_usd={self.cost_usd:.6f})"


class BudgetLedger:
    """Day budgets and rate buckets of every origin, over a ``Ledger`` port. Thread-safe."""

    def __init__(self, ledger: Ledger, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._ledger = ledger
        self._clock = clock
        self._mono = monotonic
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], list[float]] = {}  # (origin, day) -> [tokens, cost]
        self._buckets: dict[str, TokenBucket] = {}

    # -- rate ------------------------------------------------------------------------------
    def _bucket(self, origin: str, rpm: float) -> TokenBucket:
        # One bucket per origin, outliving grants: it counts the origin's recent requests, and the
        # current grant's limit only decides how many are allowed. Keyed by origin, not by grant, so a
        # revoke + re-issue at the same limit cannot reset the rate; resized (used kept) when the limit
        # changes, so an exhausted bucket of an old limit does not starve a wider new one.
        bucket = self._buckets.get(origin)
        if bucket is None:
            self._buckets[origin] = bucket = TokenBucket(rpm, clock=self._mono)
        elif bucket.rate != rpm:
            bucket.resize(rpm)
        return bucket

    def take_request(self, origin: str, grant: Grant) -> None:
        """Count one request against the origin's requests-per-minute bucket.

        Raises:
            GateRefusal: ``BUDGET_EXCEEDED`` with ``retry_after`` seconds in its data.
        """
        rpm = grant.budget.requests_per_minute
        if rpm is None:
            return
        if not 0 < rpm < float("inf"):
            # zero, negative or NaN: no request may pass (fail closed); inf would break the bucket math
            if rpm == float("inf"):
                return
            raise GateRefusal(Code.BUDGET_EXCEEDED, "this grant allows no requests (requests_per_minute <= 0)",
                              data={"limit": "requests_per_minute", "retry_after": None})
        with self._lock:
            bucket = self._bucket(origin, rpm)
            if bucket.try_take():
                return
            wait = bucket.retry_after()
        raise GateRefusal(Code.BUDGET_EXCEEDED,
                          f"rate limit of {rpm:g} requests per minute reached; retry in {wait:.1f}s",
                          data={"limit": "requests_per_minute", "retry_after": round(wait, 3)})

    # -- day budgets -----------------------------------------------------------------------
    def reserve(self, origin: str, grant: Grant, *, tokens: int, cost_usd: float) -> Reservation:
        """Hold ``tokens`` and ``cost_usd`` against today's limits of ``grant``.

        Raises:
            GateRefusal: ``BUDGET_EXCEEDED`` when committed + held + this would pass a limit.
            ValueError: a negative or non-numeric amount.
        """
        _check_amount(tokens, cost_usd)
        budget = grant.budget
        day = utc_day(self._clock())
        with self._lock:
            used_t, used_c = self._ledger.usage(origin, day)
            held = self._held.get((origin, day), [0, 0.0])
            # "not <=" rather than ">": a NaN limit then refuses instead of letting everything through
            if budget.tokens_per_day is not None and not used_t + held[0] + tokens <= budget.tokens_per_day:
                raise GateRefusal(
                    Code.BUDGET_EXCEEDED,
                    f"daily token budget of {budget.tokens_per_day} would be exceeded "
                    f"({used_t} used, {int(held[0])} in flight, {tokens} requested)",
                    data={"limit": "tokens_per_day", "day": day})
            if budget.cost_per_day_usd is not None and not used_c + held[1] + cost_usd <= budget.cost_per_day_usd:
                raise GateRefusal(
                    Code.BUDGET_EXCEEDED,
                    f"daily cost budget of ${budget.cost_per_day_usd:.2f} would be exceeded "
                    f"(${used_c:.4f} used, ${held[1]:.4f} in flight, ${cost_usd:.4f} requested)",
                    data={"limit": "cost_per_day_usd", "day": day})
            self._held[(origin, day)] = [held[0] + tokens, held[1] + cost_usd]
        return Reservation(self, origin, day, tokens, float(cost_usd))

    def _finish(self, res: Reservation, tokens: int | None, cost_usd: float | None) -> None:
        with self._lock:
            if res._done:
                return
            if tokens is not None and cost_usd is not None:
                # Commit first: if the ledger write fails the hold stays, which keeps spend counted.
                self._ledger.add_usage(res.origin, res.day, tokens, cost_usd)
            res._done = True
            key = (res.origin, res.day)
            held = self._held.get(key)
            if held is not None:
                held[0] -= res.tokens
                held[1] -= res.cost_usd
                if held[0] <= 0 and held[1] <= 1e-12:
                    del self._held[key]

    def usage(self, origin: str, grant: Grant | None = None) -> dict:
        """Today's usage and limits of ``origin`` (limits from ``grant`` when given)."""
        day = utc_day(self._clock())
        budget = grant.budget if grant is not None else None
        with self._lock:
            tokens, cost = self._ledger.usage(origin, day)
            held = self._held.get((origin, day), [0, 0.0])
            rpm = budget.requests_per_minute if budget is not None else None
            bucket = self._buckets.get(origin)
            if bucket is not None and rpm is not None and 0 < rpm < float("inf"):
                bucket = self._bucket(origin, rpm)  # report against the given grant's limit
            available = bucket.available() if bucket is not None else rpm
        return {
            "day": day,
            "tokens": int(tokens),
            "cost_usd": float(cost),
            "reserved_tokens": int(held[0]),
            "reserved_cost_usd": max(0.0, float(held[1])),
            "tokens_limit": budget.tokens_per_day if budget is not None else None,
            "cost_limit": budget.cost_per_day_usd if budget is not None else None,
            "rpm_limit": rpm,
            "rpm_available": available,
        }


def _stricter(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


class RunBudget:
    """Per-run caps: model steps and tokens (``grant.budget.max_steps_per_run`` / ``max_tokens_per_run``)."""

    def __init__(self, max_steps: int | None, max_tokens: int | None) -> None:
        self.max_steps = max_steps
        self.max_tokens = max_tokens
        self.steps = 0
        self.tokens = 0
        self._lock = threading.Lock()

    def narrow_to(self, max_steps: int | None, max_tokens: int | None) -> None:
        """Tighten the caps to the stricter of the current ones and these (None: no limit on that
        axis). The gate calls it with the live grant's caps at every model request, so a grant
        narrowed mid-run takes effect at the run's next step; a widened grant never widens a
        running run (its caps only ever come down)."""
        with self._lock:
            self.max_steps = _stricter(self.max_steps, max_steps)
            self.max_tokens = _stricter(self.max_tokens, max_tokens)

    def check_step(self) -> None:
        """Raise if one more step would pass the cap (counts nothing)."""
        if self.max_steps is not None and not self.steps + 1 <= self.max_steps:
            raise GateRefusal(Code.BUDGET_EXCEEDED, f"step limit of {self.max_steps} per run reached",
                              data={"limit": "max_steps_per_run"})

    def step(self) -> None:
        """Count one step.

        Raises:
            GateRefusal: ``BUDGET_EXCEEDED`` past the step cap (the step is not counted).
        """
        with self._lock:
            self.check_step()
            self.steps += 1

    def add_tokens(self, n: int) -> None:
        """Count ``n`` tokens the run used (actuals: always counted, even past the cap)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError("n must be a non-negative int")
        with self._lock:
            self.tokens += n

    def check_tokens(self, n_more: int = 0) -> None:
        """Raise when the run has used, or with ``n_more`` would use, more than its token cap.

        Raises:
            GateRefusal: ``BUDGET_EXCEEDED``.
        """
        if not isinstance(n_more, int) or isinstance(n_more, bool) or n_more < 0:
            raise ValueError("n_more must be a non-negative int")
        if self.max_tokens is not None and not self.tokens + n_more <= self.max_tokens:
            raise GateRefusal(
                Code.BUDGET_EXCEEDED,
                f"token limit of {self.max_tokens} per run reached ({self.tokens} used, {n_more} more asked)",
                data={"limit": "max_tokens_per_run"})
