"""Permission routing: the ``ConsentPort`` of ASK mode (docs/gate.md §10, docs/security.md).

A permission request is answered by its *originator* only (the client whose request started the
run); an authenticated browser session of the user owning the origin may answer too (the side
panel). Anyone else gets ``NOT_ORIGINATOR``. "Exactly one answer wins" is structural: the check
and the resolution happen in one synchronous step on the event loop, and a request that has ended
(answered, timed out, cancelled, withdrawn) refuses every later answer with ``CONFLICT`` — never a
second execution.

Scopes of an ALLOW (the request's ``scopes`` field lists those offered):

- ``once``: this call only;
- ``run``: the same tool in the same run is allowed without asking again (kept in memory);
- ``notebook``: saved trust for (origin, tool) — a changed tool asks again.

Both ``run`` and ``notebook`` are bound to the tool's identity
(:func:`~relay_jupyter.runtime.tools.tool_identity`: source, name, description, schema and
annotations). A tool that runs model-written code in the kernel (``ToolSpec.runs_code``:
``run_code``) is offered ``once`` only: an answer with another scope is refused with
``WIDENING_REFUSED`` (the request stays pending), and no run allow or saved trust ever applies to
it. A call to a tool that changed since the run was offered it (its preview carries
``tool_changed``) always asks, whatever was allowed before.

Every request ends with exactly one ``permission.resolved``: ``allow`` / ``deny`` (an answer or a
kill), ``timeout`` (after ``permission_timeout``, at the request's deadline), ``cancelled`` (the
call was cancelled) or ``withdrawn`` (its kernel restarted, shut down or died: :meth:`withdraw`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.caller import Caller
from ..core.errors import Code, RoutingRefusal
from ..core.memory import MemoryStore
from ..core.ports import TrustStore
from ..core.types import ConsentDecision, ConsentRequest, ConsentResult, ConsentScope
from ..protocol.names import EventType
from ..runtime.tools import tool_identity
from .events import EventBus
from .pending import PendingBook, may_act_for  # may_act_for: re-exported (its home was here)

__all__ = ["MemoryTrust", "PendingPermission", "PermissionRouter", "TrustBook", "may_act_for"]

ALL_SCOPES = (ConsentScope.ONCE.value, ConsentScope.RUN.value, ConsentScope.NOTEBOOK.value)
ONCE_ONLY = (ConsentScope.ONCE.value,)


TrustBook = TrustStore
"""Saved "always allow for this notebook" trust: the store's (``core.ports.TrustStore``)."""

MemoryTrust = MemoryStore
"""In-memory trust: the one in-memory store (``core.memory.MemoryStore``)."""


@dataclass
class PendingPermission:
    """A permission request waiting for its answer."""

    request: ConsentRequest
    originator: str | None
    origin: str
    event_id: int
    future: asyncio.Future[ConsentResult]
    created_at: float
    ended: bool = False
    outcome: str = ""
    payload: dict[str, Any] = field(default_factory=dict)
    scopes: tuple[str, ...] = ALL_SCOPES
    """The scopes an ALLOW may take (``once`` only for a tool that runs model-written code)."""

    @property
    def request_id(self) -> str:
        return self.request.request_id


class PermissionRouter:
    """Routes consent requests to their originator and waits, finitely, for the answer."""

    def __init__(self, events: EventBus, *, trust: TrustBook, timeout: float = 300.0,
                 clock: Callable[[], float] = time.time) -> None:
        if not timeout > 0:
            raise ValueError("permission timeout must be positive and finite")
        self.events = events
        self.trust = trust
        self.timeout = timeout
        self.clock = clock
        # the pending map, ended ids, who may answer, the answer's first checks: shared with the elicitation router
        self._book: PendingBook[PendingPermission] = PendingBook("permission request")
        self._pending = self._book.pending
        self._run_allows: dict[str, set[tuple[tuple[str, str], str]]] = {}
        """run_id -> ((server, tool), tool identity) allowed for the rest of that run (scope=run)."""

    # -- the ConsentPort ---------------------------------------------------------------------------

    async def ask(self, request: ConsentRequest) -> ConsentResult:
        """Decide a write: remembered run scope or saved trust first, else ask the originator."""
        req = request.request
        once_only = req.tool.runs_code
        changed = req.preview.get("tool_changed")
        if not once_only and changed is None:  # neither a run allow nor saved trust reaches these
            identity = tool_identity(req.tool)
            if req.run_id is not None and (req.tool.key, identity) in self._run_allows.get(req.run_id, ()):
                return ConsentResult(decision=ConsentDecision.ALLOW, scope=ConsentScope.RUN,
                                     answered_by="scope:run")
            if self.trust.has_trust(req.origin, *req.tool.key, identity):  # (server, tool): never a joined name
                return ConsentResult(decision=ConsentDecision.ALLOW, scope=ConsentScope.NOTEBOOK,
                                     answered_by="trust:notebook")
        scopes = ONCE_ONLY if once_only else ALL_SCOPES
        now = self.clock()
        deadline = min(request.deadline, now + self.timeout)
        request_id = request.request_id or f"pr_{secrets.token_hex(8)}"
        if self._book.known(request_id):
            raise RoutingRefusal(Code.CONFLICT, f"permission request {request_id} already exists")
        payload = {
            "request_id": request_id,
            "originator": req.originator,
            "origin": req.origin,
            "run_id": req.run_id,
            "call_id": req.call_id,
            "conversation": req.conversation,
            "tool": req.tool.name,
            "server": req.tool.server,
            "tool_class": req.tool.tool_class.value,
            "description": req.tool.description,
            "arguments": req.arguments,
            "reasons": list(req.reasons),
            "preview": {k: v for k, v in req.preview.items() if k != "tool_changed"},
            "deadline": deadline,
            "scopes": list(scopes),
        }
        if changed is not None:
            payload["tool_changed"] = changed
        event = self.events.append(EventType.PERMISSION_REQUEST, payload, origin=req.origin, run_id=req.run_id)
        future: asyncio.Future[ConsentResult] = asyncio.get_running_loop().create_future()
        pending = PendingPermission(request=request, originator=req.originator, origin=req.origin,
                                    event_id=event.id, future=future, created_at=now, payload=payload,
                                    scopes=scopes)
        self._book.add(pending)
        try:
            async with asyncio.timeout(max(0.0, deadline - self.clock())):
                return await asyncio.shield(future)
        except TimeoutError:
            if future.done():  # answered in the same tick the timer fired: the answer stands
                return future.result()
            self._end(pending, "timeout")
            answered_at = self.clock()
            self.events.append(EventType.PERMISSION_TIMEOUT, {"request_id": request_id}, origin=req.origin,
                               run_id=req.run_id)
            self.events.append(EventType.PERMISSION_RESOLVED,
                               {"request_id": request_id, "decision": "timeout", "scope": "once",
                                "answered_by": "timeout", "answered_at": answered_at},
                               origin=req.origin, run_id=req.run_id)
            return ConsentResult(decision=ConsentDecision.TIMEOUT, answered_by="timeout", answered_at=answered_at,
                                 reason=f"no answer within {deadline - now:.0f} s")
        except asyncio.CancelledError:
            if not pending.ended:
                self._end(pending, "cancelled")
                self.events.append(EventType.PERMISSION_RESOLVED,
                                   {"request_id": request_id, "decision": "cancelled", "scope": "once",
                                    "answered_by": None, "answered_at": self.clock()},
                                   origin=req.origin, run_id=req.run_id)
            raise

    # -- answers -----------------------------------------------------------------------------------

    def answer(self, caller: Caller, request_id: str, decision: ConsentDecision, scope: ConsentScope
               ) -> ConsentResult:
        """Resolve a pending request for ``caller``.

        Raises:
            RoutingRefusal: NOT_FOUND (unknown id), CONFLICT (already ended), NOT_ORIGINATOR,
                WIDENING_REFUSED (an ALLOW with a scope the request does not offer; it stays pending).
        """
        if decision not in (ConsentDecision.ALLOW, ConsentDecision.DENY):
            raise RoutingRefusal(Code.CONFLICT, "an answer is allow or deny")
        pending = self._book.open_for(
            caller, request_id,
            not_originator="only the notebook that started this run can answer its permission request")
        if decision is ConsentDecision.ALLOW and scope.value not in pending.scopes:
            raise RoutingRefusal(Code.WIDENING_REFUSED,
                                 f"{pending.request.request.tool.name} runs code the model wrote in the kernel: it is "
                                 "approved one call at a time (scope once); the request is still open",
                                 data={"request_id": request_id, "scopes": list(pending.scopes)})
        result = ConsentResult(decision=decision, scope=scope if decision is ConsentDecision.ALLOW else
                               ConsentScope.ONCE, answered_by=caller.client_id, answered_at=self.clock())
        # Resolution is synchronous from here on: a second answer, arriving in any later tick, sees ended.
        self._end(pending, decision.value)
        pending.future.set_result(result)
        if result.decision is ConsentDecision.ALLOW:
            self._remember(pending, result.scope)
        self.events.append(EventType.PERMISSION_RESOLVED,
                           {"request_id": request_id, "decision": result.decision.value,
                            "scope": result.scope.value, "answered_by": result.answered_by,
                            "answered_at": result.answered_at},
                           origin=pending.origin, run_id=pending.request.request.run_id)
        return result

    def _may_answer(self, caller: Caller, pending: PendingPermission) -> bool:
        return self._book.may_answer(caller, pending)

    def _remember(self, pending: PendingPermission, scope: ConsentScope) -> None:
        req = pending.request.request
        if scope.value not in pending.scopes:  # answer() refuses these; never remember one
            return
        if scope is ConsentScope.RUN and req.run_id is not None:
            self._run_allows.setdefault(req.run_id, set()).add((req.tool.key, tool_identity(req.tool)))
        elif scope is ConsentScope.NOTEBOOK:
            self.trust.add_trust(req.origin, *req.tool.key, tool_identity(req.tool))

    def _end(self, pending: PendingPermission, outcome: str) -> None:
        pending.outcome = outcome
        self._book.end(pending, outcome)

    # -- queries and bulk actions ------------------------------------------------------------------

    def pending_for(self, caller: Caller) -> list[PendingPermission]:
        """Pending requests ``caller`` may answer, oldest first."""
        return sorted((p for p in self._pending.values() if self._may_answer(caller, p)),
                      key=lambda p: p.event_id)

    def pending_originators(self) -> set[str]:
        """The client ids that have a pending request (the hub service checks their servers are still there)."""
        return {p.originator for p in self._pending.values() if p.originator}

    def deny_all(self, origin: str | None = None, *, answered_by: str = "kill") -> int:
        """Deny every pending request (of ``origin`` when given). Returns how many."""
        count = 0
        for pending in list(self._pending.values()):
            if origin is not None and pending.origin != origin:
                continue
            result = ConsentResult(decision=ConsentDecision.DENY, answered_by=answered_by, answered_at=self.clock())
            self._end(pending, "deny")
            if not pending.future.done():
                pending.future.set_result(result)
            self.events.append(EventType.PERMISSION_RESOLVED,
                               {"request_id": pending.request_id, "decision": "deny", "scope": "once",
                                "answered_by": answered_by, "answered_at": result.answered_at},
                               origin=pending.origin, run_id=pending.request.request.run_id)
            count += 1
        return count

    def withdraw(self, *, originator: str, reason: str) -> list[str]:
        """Withdraw every pending request of client ``originator`` at once (its kernel restarted,
        shut down or died): each is denied, gets one ``permission.resolved`` with decision
        ``withdrawn``, and every later answer — from any caller, the browser panel included — gets
        ``CONFLICT`` and changes nothing. Returns the withdrawn request ids."""
        withdrawn: list[str] = []
        for pending in list(self._pending.values()):
            if pending.originator != originator:
                continue
            answered_at = self.clock()
            self._end(pending, "withdrawn")
            if not pending.future.done():
                pending.future.set_result(ConsentResult(decision=ConsentDecision.DENY, answered_by=f"withdrawn:{reason}",
                                                        answered_at=answered_at,
                                                        reason=f"withdrawn: the kernel {reason}"))
            self.events.append(EventType.PERMISSION_RESOLVED,
                               {"request_id": pending.request_id, "decision": "withdrawn", "scope": "once",
                                "answered_by": None, "answered_at": answered_at, "reason": reason},
                               origin=pending.origin, run_id=pending.request.request.run_id)
            withdrawn.append(pending.request_id)
        return withdrawn

    def forget_run(self, run_id: str) -> None:
        """Drop the run-scoped allows of a finished run."""
        self._run_allows.pop(run_id, None)
