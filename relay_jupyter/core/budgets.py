"""Budgets: requests per minute, tokens and cost per origin per UTC day, caps per run.

Day budgets work by *reserve before, settle after*. Before a model request is sent, its upper
bound (:func:`estimate_request`: the whole request — system prompt, tool definitions, history —
plus ``max_tokens``, priced at the model's highest rates) is held against the day's limit. The
hold lives **in the store** (``Ledger.hold``: in SQLite one ``BEGIN IMMEDIATE`` transaction reads
the committed usage and the live holds, checks the limits and inserts the hold), so any number of
broker processes on one data dir share the limit and together can never overspend what was free.

After the response, :meth:`Reservation.settle` commits the charged usage and drops the hold in
one transaction. What is charged is decided by :func:`judge_usage` (see docs/gate.md §6):
reported usage within the request's bounds as reported; absurd usage (negative, input above the
estimate, output above ``max_tokens``) clamped to the reservation and flagged; no usage reported
(a llama.cpp server streaming) an estimate from the request and the streamed text; a request
cancelled or failed mid-stream its whole reservation. :meth:`Reservation.release` drops a hold
for a request that was never sent.

**Teams** (core/teams.py): when the origin's user belongs to teams, the request is also held
against each team's day and month limits (ledger keys ``team:<name>``, day ``YYYY-MM-DD`` and month
``YYYY-MM`` rows), all in one store transaction when the store offers one (``transaction``), in one
fixed order of keys (two brokers never wait on each other's rows in opposite orders): the tightest
limit refuses, and a refusal holds nothing. Without a transaction the holds already taken are
released on a refusal (never an overspend; at worst a concurrent request near the limit is refused
while they existed). Settling commits the same charge to every hold of the reservation.

A hold whose broker died is never settled: it expires (``hold_ttl``, default 15 minutes) and the
next reservation of any broker charges it in full, since the request it covered may have been
sent. Until then it counts as held, so it is never free budget.
"""

from __future__ import annotations

import json
import math
import string
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .errors import Code, GateRefusal
from .ports import Ledger
from .teams import Team
from .types import Grant, ToolSpec, Usage

__all__ = ["HOLD_TTL", "BudgetLedger", "Charge", "RequestEstimate", "Reservation", "RunBudget", "TokenBucket",
           "cost_within", "estimate_request", "estimate_text_tokens", "judge_usage", "profile_key", "utc_day"]

#: Seconds a hold lives without being settled before it is charged in full (its broker is gone).
HOLD_TTL = 900.0


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
    """A hold on an origin's day budget. Settle it or release it exactly once (repeats are no-ops).

    ``estimate`` (when the caller gave one) is the request's bound the hold was sized from; the gate
    judges the reported usage against it (:func:`judge_usage`)."""

    __slots__ = ("_book", "_done", "charge", "charged_usd", "cost_usd", "day", "estimate", "hold_id", "origin",
                 "team_holds", "tokens")

    def __init__(self, book: BudgetLedger, origin: str, day: str, tokens: int, cost_usd: float,
                 hold_id: str, estimate: RequestEstimate | None = None, team_holds: tuple[str, ...] = ()) -> None:
        self._book = book
        self.origin = origin
        self.day = day
        self.tokens = tokens
        self.cost_usd = cost_usd
        self.hold_id = hold_id
        self.estimate = estimate
        self.team_holds = team_holds
        """The holds of the same amount on the origin's teams' day and month rows (core/teams.py)."""
        self.charge: Charge | None = None
        """What the gate charged at settle (:func:`judge_usage`), None before."""
        self.charged_usd: float | None = None
        self._done = False

    @property
    def done(self) -> bool:
        """True once settled or released."""
        return self._done

    def settle(self, tokens: int, cost_usd: float) -> None:
        """Commit ``tokens``/``cost_usd`` and drop the hold (one store transaction). The ledger level
        commits what it is given, even above the hold: bounding it is the gate's job (:func:`judge_usage`).

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
    """Day budgets and rate buckets of every origin, over a ``Ledger`` port. Thread-safe.

    Day holds are kept by the port (shared by every process on the same store); rate buckets are
    per process (a second broker on the same data dir has its own requests-per-minute bucket).

    Args:
        hold_ttl: seconds after which an unsettled hold is charged in full (its broker died).
    """

    def __init__(self, ledger: Ledger, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, hold_ttl: float = HOLD_TTL,
                 teams_for: Callable[[str], list[Team]] | None = None,
                 transaction: Callable[[], AbstractContextManager[Any]] | None = None) -> None:
        if not hold_ttl > 0:
            raise ValueError("hold_ttl must be positive")
        self._ledger = ledger
        self._teams_for = teams_for
        """origin -> the teams whose budgets its requests also draw from (core/teams.py)."""
        self._transaction = transaction
        """The store's transaction: a reservation's holds (origin and teams) commit together."""
        self._clock = clock
        self._mono = monotonic
        self._hold_ttl = float(hold_ttl)
        self._lock = threading.Lock()
        self._finish_lock = threading.Lock()  # not _lock: a settle's store commit must not stall rate checks
        self._buckets: dict[str, TokenBucket] = {}

    # -- rate ------------------------------------------------------------------------------
    def use_teams(self, teams_for: Callable[[str], list[Team]],
                  transaction: Callable[[], AbstractContextManager[Any]] | None = None) -> None:
        """Resolve an origin's teams with ``teams_for`` from now on (the JupyterHub service: a user's hub
        groups name their teams, learned with each token); ``transaction``: the store's, when not set yet."""
        self._teams_for = teams_for
        if transaction is not None:
            self._transaction = transaction

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
    def reserve(self, origin: str, grant: Grant, *, tokens: int, cost_usd: float,
                estimate: RequestEstimate | None = None, profile: str | None = None) -> Reservation:
        """Hold ``tokens`` and ``cost_usd`` against today's limits of ``grant`` (in the store, atomically
        with the check); for a request to ``profile`` whose grant caps it (``Grant.profile_budgets``), also
        against that profile's day limits (ledger row :func:`profile_key`), all or none.

        Raises:
            GateRefusal: ``BUDGET_EXCEEDED`` when committed + held + this would pass a limit.
            ValueError: a negative or non-numeric amount.
        """
        _check_amount(tokens, cost_usd)
        budget = grant.budget
        now = self._clock()
        day = utc_day(now)

        def check(used_t: int, used_c: float, held_t: int, held_c: float) -> None:
            # "not <=" rather than ">": a NaN limit then refuses instead of letting everything through
            if budget.tokens_per_day is not None and not used_t + held_t + tokens <= budget.tokens_per_day:
                raise GateRefusal(
                    Code.BUDGET_EXCEEDED,
                    f"daily token budget of {budget.tokens_per_day} would be exceeded "
                    f"({used_t} used, {int(held_t)} in flight, {tokens} requested)",
                    data={"limit": "tokens_per_day", "day": day})
            if budget.cost_per_day_usd is not None and not used_c + held_c + cost_usd <= budget.cost_per_day_usd:
                raise GateRefusal(
                    Code.BUDGET_EXCEEDED,
                    f"daily cost budget of ${budget.cost_per_day_usd:.2f} would be exceeded "
                    f"(${used_c:.4f} used, ${held_c:.4f} in flight, ${cost_usd:.4f} requested)",
                    data={"limit": "cost_per_day_usd", "day": day})

        teams = self._teams_for(origin) if self._teams_for is not None else []
        capped = grant.profile_budget(profile)
        if not teams and capped is None:
            hold_id = self._ledger.hold(origin, day, int(tokens), float(cost_usd), now=now,
                                        expires_at=now + self._hold_ttl, check=check)
            return Reservation(self, origin, day, tokens, float(cost_usd), hold_id, estimate)
        scopes: list[tuple[str, str, Callable[[int, float, int, float], None]]] = [(origin, day, check)]
        if capped is not None:
            scopes.append((profile_key(origin, capped.profile), day,
                           _profile_check(capped, day, int(tokens), float(cost_usd))))
        for team in teams:
            for period, key_day, t_limit, c_limit in team.budget.limits(day):
                scopes.append((team.key, key_day, _team_check(team.name, period, key_day, t_limit, c_limit,
                                                              int(tokens), float(cost_usd))))
        scopes.sort(key=lambda s: (s[0], s[1]))  # one order of row locks for every broker
        self._ledger.sweep_holds(now)
        ids = self._hold_all(scopes, int(tokens), float(cost_usd), now)
        own = ids.pop(next(n for n, s in enumerate(scopes) if s[0] == origin and s[1] == day))
        return Reservation(self, origin, day, tokens, float(cost_usd), own, estimate, tuple(ids))

    def _hold_all(self, scopes: list[tuple[str, str, Callable[[int, float, int, float], None]]], tokens: int,
                  cost_usd: float, now: float) -> list[str]:
        """A hold on every scope, all or none (one transaction; else released again on a refusal)."""
        def hold(key: str, day: str, check: Callable[[int, float, int, float], None]) -> str:
            return self._ledger.hold(key, day, tokens, cost_usd, now=now, expires_at=now + self._hold_ttl,
                                     check=check)

        if self._transaction is not None:
            with self._transaction():
                return [hold(*scope) for scope in scopes]
        taken: list[str] = []
        try:
            for scope in scopes:
                taken.append(hold(*scope))
        except BaseException:
            for hold_id in taken:
                try:
                    self._ledger.finish_hold(hold_id, None, None)
                except Exception:  # noqa: BLE001 - the hold then expires and is charged: never free budget
                    pass
            raise
        return taken

    def _finish(self, res: Reservation, tokens: int | None, cost_usd: float | None) -> None:
        with self._finish_lock:
            if res._done:
                return
            # one store transaction: commit, then drop the hold; if it fails the hold stays (spend counted)
            if res.team_holds and self._transaction is not None:
                with self._transaction():
                    for hold_id in (res.hold_id, *res.team_holds):
                        self._ledger.finish_hold(hold_id, tokens, cost_usd)
            else:
                for hold_id in (res.hold_id, *res.team_holds):
                    self._ledger.finish_hold(hold_id, tokens, cost_usd)
            res._done = True

    def usage(self, origin: str, grant: Grant | None = None) -> dict:
        """Today's usage and limits of ``origin`` (limits from ``grant`` when given)."""
        day = utc_day(self._clock())
        budget = grant.budget if grant is not None else None
        tokens, cost = self._ledger.usage(origin, day)
        held = self._ledger.held(origin, day)
        with self._lock:
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
            **({"teams": self.team_usage(origin, day)} if self._teams_for is not None else {}),
            **({"profiles": self.profile_usage(origin, grant, day)} if grant is not None and grant.profile_budgets
               else {}),
        }

    def profile_usage(self, origin: str, grant: Grant, day: str | None = None) -> list[dict[str, Any]]:
        """Per profile the grant caps (``Grant.profile_budgets``): today's usage, live holds, limits and what they
        leave (``remaining_tokens`` / ``remaining_cost_usd``; None: no limit on that axis)."""
        day = day or utc_day(self._clock())
        out = []
        for capped in grant.profile_budgets:
            used_t, used_c = self._ledger.usage(profile_key(origin, capped.profile), day)
            held_t, held_c = self._ledger.held(profile_key(origin, capped.profile), day)
            t_limit, c_limit = capped.tokens_per_day, capped.cost_per_day_usd
            out.append({"profile": capped.profile, "day": day, "tokens": int(used_t), "cost_usd": float(used_c),
                        "reserved_tokens": int(held_t), "reserved_cost_usd": max(0.0, float(held_c)),
                        "tokens_limit": t_limit, "cost_limit": c_limit,
                        "remaining_tokens": None if t_limit is None else max(0, t_limit - used_t - held_t),
                        "remaining_cost_usd": None if c_limit is None else max(0.0, c_limit - used_c - held_c)})
        return out

    def team_usage(self, origin: str, day: str | None = None) -> list[dict[str, Any]]:
        """Per team of ``origin``: its day and month usage, live holds and limits, and ``remaining``
        (the smallest of what its limits leave, in tokens and in dollars; None: no limit)."""
        day = day or utc_day(self._clock())
        out = []
        for team in self._teams_for(origin) if self._teams_for is not None else []:
            row: dict[str, Any] = {"team": team.name}
            left_t: list[int] = []
            left_c: list[float] = []
            b = team.budget
            for period, key_day, t_limit, c_limit in (("day", day, b.tokens_per_day, b.cost_per_day_usd),
                                                      ("month", day[:7], b.tokens_per_month, b.cost_per_month_usd)):
                used_t, used_c = self._ledger.usage(team.key, key_day)
                held_t, held_c = self._ledger.held(team.key, key_day)
                row[period] = {"key": key_day, "tokens": int(used_t), "cost_usd": float(used_c),
                               "reserved_tokens": int(held_t), "reserved_cost_usd": max(0.0, float(held_c)),
                               "tokens_limit": t_limit, "cost_limit": c_limit}
                if t_limit is not None:
                    left_t.append(max(0, t_limit - used_t - held_t))
                if c_limit is not None:
                    left_c.append(max(0.0, c_limit - used_c - held_c))
            row["remaining_tokens"] = min(left_t) if left_t else None
            row["remaining_cost_usd"] = min(left_c) if left_c else None
            out.append(row)
        return out


def profile_key(origin: str, profile: str) -> str:
    """The ledger row of ``origin``'s requests to ``profile`` (``Grant.profile_budgets``)."""
    return f"{origin}|profile:{profile}"


def _profile_check(capped: Any, day: str, tokens: int, cost_usd: float) -> Callable[[int, float, int, float], None]:
    """The check of one profile's day limits (``core.types.ProfileBudget``), for ``Ledger.hold``."""
    def check(used_t: int, used_c: float, held_t: int, held_c: float) -> None:
        t_limit, c_limit = capped.tokens_per_day, capped.cost_per_day_usd
        if t_limit is not None and not used_t + held_t + tokens <= t_limit:
            raise GateRefusal(
                Code.BUDGET_EXCEEDED,
                f"the profile {capped.profile}'s daily token budget of {t_limit} would be exceeded "
                f"({used_t} used, {int(held_t)} in flight, {tokens} requested)",
                data={"limit": "profile_tokens_per_day", "profile": capped.profile, "day": day})
        if c_limit is not None and not used_c + held_c + cost_usd <= c_limit:
            raise GateRefusal(
                Code.BUDGET_EXCEEDED,
                f"the profile {capped.profile}'s daily cost budget of ${c_limit:.2f} would be exceeded "
                f"(${used_c:.4f} used, ${held_c:.4f} in flight, ${cost_usd:.4f} requested)",
                data={"limit": "profile_cost_per_day_usd", "profile": capped.profile, "day": day})
    return check


def _team_check(team: str, period: str, key_day: str, t_limit: int | None, c_limit: float | None, tokens: int,
                cost_usd: float) -> Callable[[int, float, int, float], None]:
    """The check of one team period (day or month), for ``Ledger.hold``."""
    word = "daily" if period == "day" else "monthly"

    def check(used_t: int, used_c: float, held_t: int, held_c: float) -> None:
        if t_limit is not None and not used_t + held_t + tokens <= t_limit:
            raise GateRefusal(
                Code.BUDGET_EXCEEDED,
                f"team {team}'s {word} token budget of {t_limit} would be exceeded "
                f"({used_t} used, {int(held_t)} in flight across the team, {tokens} requested)",
                data={"limit": f"team_tokens_per_{period}", "team": team, period: key_day})
        if c_limit is not None and not used_c + held_c + cost_usd <= c_limit:
            raise GateRefusal(
                Code.BUDGET_EXCEEDED,
                f"team {team}'s {word} cost budget of ${c_limit:.2f} would be exceeded "
                f"(${used_c:.4f} used, ${held_c:.4f} in flight across the team, ${cost_usd:.4f} requested)",
                data={"limit": f"team_cost_per_{period}", "team": team, period: key_day})

    return check


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


# ---- request estimates -------------------------------------------------------------------------------
#
# No tokenizer ships with relay (the providers' tokenizers are not public, or are a network round trip:
# Anthropic's count_tokens is itself rate-limited), so a request is bounded by counting its text:
#
#   * ASCII letters and whitespace: 1 token per 3 characters. Measured tokenizers (Claude, GPT
#     cl100k/o200k, Llama, Gemma) average 3.5-4.5 characters a token on English prose;
#   * ASCII digits and punctuation: 1 token each. Llama 2 and Gemma split numbers into single digits
#     and most punctuation into tokens of its own (Gemma 3 counts " (2000)" as 6 tokens); GPT and
#     Claude merge some, so code and JSON are over-counted rather than under;
#   * non-ASCII: 1 token per UTF-8 byte after the first of each character (2 for a CJK character,
#     3 for an emoji; real tokenizers use 1-2 and 1-3);
#   * framing: a few tokens per message and per tool, plus the tool-use system prompt the provider
#     adds when tools are offered (Anthropic documents 250-350 tokens).
#
# The peer test (tests/peers/test_llama_cpp.py) checks these against Gemma 3's real tokenizer.
# Text that tokenizes worse than that (random base64, long hex) can exceed the estimate; the gate then
# charges the reservation and flags the settlement "clamped" with the reported figures (judge_usage).

# str.translate deletes these in one C pass: the length lost is their count
_ONE_EACH = str.maketrans("", "", string.digits + string.punctuation)
REQUEST_OVERHEAD = 16
MESSAGE_OVERHEAD = 8
TOOL_OVERHEAD = 16
TOOLS_PROMPT_OVERHEAD = 400


def estimate_text_tokens(text: str) -> int:
    """A conservative token count of ``text`` (see the rules above). O(len(text)), no tokenizer."""
    if not text:
        return 0
    chars = len(text)
    extra = len(text.encode("utf-8", "surrogatepass")) - chars  # bytes after the first of non-ASCII chars
    rest = len(text.translate(_ONE_EACH))
    return -(-rest // 3) + (chars - rest) + extra


@dataclass(frozen=True, slots=True)
class RequestEstimate:
    """The bound of one model request: ``input_tokens`` for everything sent, ``max_output`` for the
    answer (the request's ``max_tokens``). ``total`` is what a reservation holds."""

    input_tokens: int
    max_output: int

    @property
    def total(self) -> int:
        return self.input_tokens + self.max_output


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def estimate_request(system: str, messages: Iterable[Mapping[str, Any]], tools: Iterable[ToolSpec | Mapping[str, Any]],
                     max_tokens: int) -> RequestEstimate:
    """The conservative estimate of a whole request: system prompt, every message (all its blocks as
    JSON: text, tool calls and their arguments, tool results), every tool definition (name,
    description, input schema), framing, and ``max_tokens`` for the answer.

    Raises:
        ValueError: ``max_tokens`` is not a non-negative int.
    """
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise ValueError("max_tokens must be a non-negative int")
    n = REQUEST_OVERHEAD + estimate_text_tokens(system or "")
    for m in messages:
        content = m.get("content")
        n += MESSAGE_OVERHEAD + estimate_text_tokens(content if isinstance(content, str) else _json(content))
    offered = 0
    for t in tools:
        offered += 1
        if isinstance(t, ToolSpec):
            body = _json([t.name, t.description, t.input_schema])
        else:
            body = _json(t)
        n += TOOL_OVERHEAD + estimate_text_tokens(body)
    if offered:
        n += TOOLS_PROMPT_OVERHEAD
    return RequestEstimate(input_tokens=n, max_output=max_tokens)


# ---- settling: what a finished request is charged ----------------------------------------------------

@dataclass(frozen=True, slots=True)
class Charge:
    """What a settled request is charged, and why.

    ``basis``: ``reported`` (the server's usage, within bounds), ``clamped`` (the server's usage was
    absurd — negative, input above the estimate, output above ``max_tokens`` — so the reservation is
    charged), ``estimated`` (no usage reported: the input estimate plus the streamed output's
    estimate), ``reservation`` (cancelled, killed or failed after the answer began: the whole
    reservation), ``input_estimate`` (failed or cancelled after the request went out but before any
    of the answer arrived: the prompt may have been processed, and a streamed answer is sent as it is
    generated, so the input estimate), ``refused`` (the server answered an HTTP error before anything:
    nothing). ``usage`` is None when the reservation itself is charged (cost: the reservation's).
    """

    basis: str
    tokens: int
    usage: Usage | None
    reported: dict[str, int] | None = None


_USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _reported(usage: Usage) -> dict[str, int]:
    return {f: getattr(usage, f) for f in _USAGE_FIELDS}


def judge_usage(reservation_tokens: int, estimate: RequestEstimate | None, usage: Usage | None, *,
                outcome: str = "complete", streamed_output_tokens: int = 0) -> Charge:
    """Decide what a request is charged (never more than its reservation; see :class:`Charge`).

    ``outcome``: ``complete`` (the stream ended normally), ``refused`` (an HTTP error answer before
    any event, or no connection at all), ``not_started`` (failed or cancelled before any event), anything else
    (``interrupted``: cancelled, killed or failed after the answer began). ``usage`` None or all zero
    means the server reported none. ``streamed_output_tokens``: the estimate of what streamed (text
    and tool-call arguments), for a request without usage.
    """
    if outcome == "refused":
        return Charge("refused", 0, Usage())
    if outcome == "not_started" and estimate is not None:
        charged = Usage(input_tokens=estimate.input_tokens)
        return Charge("input_estimate", charged.total, charged)
    if outcome not in ("complete", "not_started"):
        return Charge("reservation", reservation_tokens, None,
                      _reported(usage) if usage is not None and usage.total else None)
    if outcome == "not_started":  # no estimate to split: the whole reservation
        return Charge("reservation", reservation_tokens, None)
    max_in = estimate.input_tokens if estimate is not None else reservation_tokens
    max_out = estimate.max_output if estimate is not None else reservation_tokens
    if usage is None or not any(getattr(usage, f) for f in _USAGE_FIELDS):
        out = min(max(0, int(streamed_output_tokens)), max_out)
        inp = max_in if estimate is not None else max(0, reservation_tokens - out)
        charged = Usage(input_tokens=inp, output_tokens=out)
        return Charge("estimated", charged.total, charged)
    fields = _reported(usage)
    inputs = fields["input_tokens"] + fields["cache_creation_input_tokens"] + fields["cache_read_input_tokens"]
    sane = all(isinstance(v, int) and 0 <= v for v in fields.values()) \
        and inputs <= max_in and fields["output_tokens"] <= max_out and usage.total <= reservation_tokens
    if not sane:
        return Charge("clamped", reservation_tokens, None, fields)
    return Charge("reported", usage.total, usage)


def cost_within(cost: float, cap: float) -> float:
    """``cost`` bounded by ``cap`` (a reservation's cost); a non-finite cost is the cap."""
    return cap if not math.isfinite(cost) else min(max(0.0, cost), cap)
