"""Grants per origin: persisted through a ``GrantStore``, narrowing-only.

A grant says which tools and models an origin may use, with which budgets, until when.
It is created by a human consent (a click on a connect card, a terminal command), whose id
it carries in ``consent_id``. Afterwards it may only be *narrowed*; replacing it with
something wider needs a *fresh* consent record — a ``consent_id`` this book has never seen
(neither the current grant's, nor any earlier one's). Anything else is
``WIDENING_REFUSED``.

The gate reads grants on every call, so the book keeps a read-through cache with a short
TTL (writes go through it): the hot path does no I/O, and a grant revoked by another process
(``jupyter relay grants revoke``) stops working within ``cache_ttl`` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from .errors import Code, GateRefusal, RoutingRefusal
from .ports import GrantStore
from .admin_policy import AdminPolicy
from .types import Budget, Grant

__all__ = ["GrantBook", "widens"]

_ALL = "*"


def _set_widens(new: frozenset[str], old: frozenset[str]) -> bool:
    if _ALL in old:
        return False
    return _ALL in new or not new <= old


def _profile_budgets_widen(new: Grant, old: Grant) -> bool:
    """A profile's day limit removed or raised widens (adding one, or lowering one, narrows)."""
    for before in old.profile_budgets:
        after = new.profile_budget(before.profile)
        for axis in ("tokens_per_day", "cost_per_day_usd"):
            limit = getattr(before, axis)
            if limit is None:
                continue
            now = getattr(after, axis) if after is not None else None
            if now is None or not now <= limit:
                return True
    return False


def widens(new: Grant, old: Grant) -> list[str]:
    """The ways ``new`` is wider than ``old`` (empty when it is equal or narrower)."""
    why: list[str] = []
    if _set_widens(new.tools, old.tools):
        why.append("tools")
    if _set_widens(new.models, old.models):
        why.append("models")
    if old.proxy_tools is not None and (new.proxy_tools is None or _set_widens(new.proxy_tools, old.proxy_tools)):
        why.append("proxy_tools")
    if _set_widens(new.profiles, old.profiles):
        why.append("profiles")
    if not new.budget.narrows(old.budget):
        why.append("budget")
    if _profile_budgets_widen(new, old):
        why.append("profile_budgets")
    if old.expires_at is not None and (new.expires_at is None or new.expires_at > old.expires_at):
        why.append("expiry")
    return why


class GrantBook:
    """The grants of every origin, narrowing-only.

    Args:
        store: where grants persist (``core.memory.MemoryGrantStore``, ``storage`` SQLite).
        clock: epoch seconds, for expiry.
        cache_ttl: seconds a cached read of the store is trusted (0 disables the cache).
    """

    def __init__(self, store: GrantStore, clock: Callable[[], float] = time.time, *,
                 cache_ttl: float = 1.0, monotonic: Callable[[], float] = time.monotonic,
                 policy: AdminPolicy | None = None) -> None:
        self._store = store
        self.policy = policy
        """The admin policy every grant read is narrowed by (core/admin_policy.py); None: none."""
        self._clock = clock
        self._mono = monotonic
        self._ttl = cache_ttl
        self._lock = threading.RLock()
        self._cache: dict[str, tuple[float, Grant | None]] = {}
        self._gen = 0
        # Every consent id seen for an origin: a widening must bring one not in here. Filled per
        # origin as the book reads or writes its grant (never by loading every grant at start, which
        # took 1.8 s with 10k grants of 1k tools: issue 18). ``issue`` and ``narrow`` read the stored
        # grant first, so a grant's consent is always seen before the book replaces it; a grant the
        # book never read (nor listed) and that is deleted is forgotten, like one deleted before start.
        # Consent ids are fresh random ids (broker/methods/grants.py, cli/grants.py): this check is defence
        # in depth against a replayed consent, not the only guard.
        self._seen: dict[str, set[str]] = {}

    def _load(self, origin: str) -> Grant | None:
        if self._ttl > 0:
            hit = self._cache.get(origin)
            if hit is not None and self._mono() - hit[0] < self._ttl:
                return hit[1]
        gen = self._gen
        grant = self._store.get_grant(origin)
        with self._lock:
            # A write (issue, narrow, revoke) that ran while we read the store bumped the
            # generation: what we read may be stale, so it must not be cached over the write.
            if self._ttl > 0 and gen == self._gen:
                self._cache[origin] = (self._mono(), grant)
            if grant is not None:
                self._seen.setdefault(origin, set()).add(grant.consent_id)
        return grant

    def _written(self, origin: str) -> None:
        # under self._lock, after the store write
        self._gen += 1
        self._cache.pop(origin, None)

    def get(self, origin: str) -> Grant | None:
        """The live grant of ``origin``; None when there is none or it has expired."""
        grant = self._load(origin)
        if grant is None:
            return None
        expires = grant.expires_at
        if expires is not None and self._clock() >= expires:
            return None
        return self.policy.narrow(grant) if self.policy is not None else grant

    def issue(self, grant: Grant) -> Grant:
        """Store ``grant`` for ``grant.origin``, replacing any existing one.

        A replacement that is wider than the stored grant (an expired one included) is
        accepted only with a consent id never seen for this origin; so is a new grant (a revoked
        grant cannot be brought back with its old consent).

        Raises:
            GateRefusal: ``WIDENING_REFUSED``, naming what would widen.
            TypeError: ``grant`` is not a Grant (build one with ``Grant(...)`` to validate input).
        """
        if not isinstance(grant, Grant):
            raise TypeError("issue() takes a Grant")
        with self._lock:
            old = self._store.get_grant(grant.origin)
            seen = self._seen.setdefault(grant.origin, set())
            if old is None:
                # Creating a grant is the widest step of all: a consent already used for this
                # origin (e.g. of a revoked grant) cannot bring it back.
                if grant.consent_id in seen:
                    raise GateRefusal(Code.WIDENING_REFUSED,
                                      f"the consent {grant.consent_id} was already used for {grant.origin}; "
                                      "granting again needs a fresh consent",
                                      data={"origin": grant.origin, "widens": ["created"]})
            else:
                seen.add(old.consent_id)
                why = widens(grant, old)
                if why and grant.consent_id in seen:
                    raise GateRefusal(
                        Code.WIDENING_REFUSED,
                        f"widening the grant of {grant.origin} ({', '.join(why)}) needs a fresh consent",
                        data={"origin": grant.origin, "widens": why},
                    )
            self._store.put_grant(grant)
            seen.add(grant.consent_id)
            self._written(grant.origin)
            return grant

    def narrow(self, origin: str, *, tools: Iterable[str] | None = None, models: Iterable[str] | None = None,
               budget: Budget | None = None, expires_at: float | None = None) -> Grant:
        """Replace parts of the live grant of ``origin`` with narrower ones; keeps its consent id.

        Raises:
            RoutingRefusal: ``NOT_FOUND`` when ``origin`` has no live grant.
            GateRefusal: ``WIDENING_REFUSED`` when any part would widen.
            pydantic.ValidationError: a value of the wrong type.
        """
        with self._lock:
            old = self.get(origin)
            if old is None:
                raise RoutingRefusal(Code.NOT_FOUND, f"no live grant for {origin}", data={"origin": origin})
            update: dict[str, object] = {}
            if tools is not None:
                update["tools"] = _names(tools, "tools")
            if models is not None:
                update["models"] = _names(models, "models")
            if budget is not None:
                update["budget"] = budget
            if expires_at is not None:
                update["expires_at"] = expires_at
            new = Grant.model_validate({**old.model_dump(), **update})
            why = widens(new, old)
            if why:
                raise GateRefusal(Code.WIDENING_REFUSED,
                                  f"narrow() cannot widen the grant of {origin} ({', '.join(why)})",
                                  data={"origin": origin, "widens": why})
            self._store.put_grant(new)
            self._written(origin)
            return new

    def revoke(self, origin: str) -> bool:
        """Delete the grant of ``origin``; True when there was one. Takes effect at once here."""
        with self._lock:
            deleted = self._store.delete_grant(origin)
            self._written(origin)
            return deleted

    def list(self) -> list[Grant]:
        """Every live (unexpired) grant, ordered by origin."""
        now = self._clock()
        grants = self._store.list_grants()
        with self._lock:
            for g in grants:
                self._seen.setdefault(g.origin, set()).add(g.consent_id)
        live = [g for g in grants if not g.expired(now)]
        return [self.policy.narrow(g) for g in live] if self.policy is not None else live

    def invalidate(self, origin: str | None = None) -> None:
        """Forget cached reads (all, or one origin's): the next read goes to the store."""
        with self._lock:
            self._gen += 1
            if origin is None:
                self._cache.clear()
            else:
                self._cache.pop(origin, None)


def _names(values: Iterable[str], what: str) -> frozenset[str]:
    if isinstance(values, str):
        # a bare string would silently become a set of characters
        raise TypeError(f"{what} must be a collection of names, not a str")
    return frozenset(values)
