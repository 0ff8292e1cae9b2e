"""The book of requests waiting for a person, shared by the permission router (``broker/permissions.py``) and the
elicitation router (``broker/elicitations.py``).

Both keep the same skeleton, written once here: the pending requests by id; the ids of ended ones (the last
10,000) so a late answer gets ``CONFLICT`` rather than ``NOT_FOUND``; who may answer (the request's originator, or
a caller that sees many origins — the user's side panel — for an origin it acts for); the checks an answer passes
before it resolves anything (``NOT_FOUND``, ``CONFLICT``, ``NOT_ORIGINATOR``), in that order; ending a request in
one synchronous step (a second answer in any later tick sees it ended); the caller's own pending requests, oldest
first. What each router decides, emits and audits stays in the router.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Generic, Protocol, TypeVar

from ..core.caller import Caller
from ..core.errors import Code, RoutingRefusal

__all__ = ["ENDED_KEEP", "PendingBook", "may_act_for"]

ENDED_KEEP = 10_000
"""Ended request ids remembered, so a late answer gets CONFLICT, not NOT_FOUND."""


def may_act_for(caller: Caller, origin: str | None) -> bool:
    """A browser session acts for every origin of its server, a hub user's panel for its user's origins; others
    only for their own origin (:meth:`Caller.acts_for`)."""
    return caller.acts_for(origin)


class _Pending(Protocol):
    request_id: Any
    origin: str
    originator: str | None
    event_id: int
    ended: bool
    future: asyncio.Future[Any]


P = TypeVar("P", bound=_Pending)


class PendingBook(Generic[P]):
    """Pending requests of one kind (``noun``: "permission request", "elicitation") and the ids of ended ones."""

    def __init__(self, noun: str, *, keep: int = ENDED_KEEP) -> None:
        self.noun = noun
        self.keep = keep
        self.pending: dict[str, P] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()

    def known(self, request_id: str) -> bool:
        """Pending or ended (an id is never used twice)."""
        return request_id in self.pending or request_id in self.ended

    def add(self, item: P) -> None:
        self.pending[item.request_id] = item

    def may_answer(self, caller: Caller, item: P) -> bool:
        """The request's originator, or a caller seeing many origins (the side panel) for one it acts for."""
        if caller.sees_many:
            return may_act_for(caller, item.origin)
        return item.originator is not None and caller.client_id == item.originator

    def open_for(self, caller: Caller, request_id: str, *, not_originator: str) -> P:
        """The pending request ``caller`` is answering, once it passed the checks every answer passes first.

        Raises:
            RoutingRefusal: NOT_FOUND (unknown id), CONFLICT (ended), NOT_ORIGINATOR (``not_originator``: the
                message).
        """
        item = self.pending.get(request_id)
        if item is None:
            ended = self.ended.get(request_id)
            if ended is not None:
                raise RoutingRefusal(Code.CONFLICT, f"{self.noun} {request_id} has already ended ({ended})")
            raise RoutingRefusal(Code.NOT_FOUND, f"no {self.noun} {request_id}")
        if not self.may_answer(caller, item):
            raise RoutingRefusal(Code.NOT_ORIGINATOR, not_originator)
        if item.ended or item.future.done():
            raise RoutingRefusal(Code.CONFLICT, f"{self.noun} {request_id} has already ended")
        return item

    def end(self, item: P, outcome: str) -> None:
        """Mark ``item`` ended with ``outcome`` (synchronously: every later answer sees it ended)."""
        item.ended = True
        self.pending.pop(item.request_id, None)
        self.ended[item.request_id] = outcome
        while len(self.ended) > self.keep:
            self.ended.popitem(last=False)

    def for_caller(self, caller: Caller) -> list[P]:
        """The pending requests ``caller`` may answer, oldest first."""
        return sorted((p for p in self.pending.values() if self.may_answer(caller, p)), key=lambda p: p.event_id)
