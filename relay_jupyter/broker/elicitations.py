"""Elicitation routing: an MCP server's question, shown as a card in the notebook whose run made the call.

The model is the permission flow (``broker/permissions.py``): the request goes out as one event to the
origin of the run (``elicitation.request``), the originating kernel shows a form card and answers with
``elicitation.answer``; only that kernel (the run's originator) or a browser session of the user may
answer; exactly one answer wins, a later one gets ``CONFLICT``; every request ends with exactly one
``elicitation.resolved``.

What differs from a permission request:

- the question is the **server's**, not relay's: the card says which server asks, during which tool
  call, and that relay did not write the message;
- an answer is ``accept`` (with the form's values, checked against the form: a wrong answer is
  ``INVALID_ARGUMENTS`` and the request stays open), ``decline`` or ``cancel``;
- nothing accepts on its own: no answer by the deadline (``timeout``, default the permission timeout)
  declines, a headless kernel declines, a kill or a kernel restart declines;
- the **values** typed never enter an event, the audit or a log: ``elicitation.resolved`` and the audit
  record name the fields answered, not what was typed (the server gets the values, nobody else);
- a request relay declined without asking (:attr:`ElicitationAsk.refused`: a credential field, a form
  over the bounds) gives only an ``elicitation.resolved`` with ``refused`` (the kernel prints one line)
  and an audit record.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.caller import Caller
from ..core.errors import Code, RoutingRefusal
from ..core.types import AuditRecord
from ..mcp.elicitation import ElicitationAnswer, ElicitationAsk, check_answer
from ..protocol.names import EventType
from .events import EventBus
from .pending import PendingBook

__all__ = ["ACTIONS", "ElicitationRouter", "PendingElicitation", "router_of"]

ACTIONS = ("accept", "decline", "cancel")


@dataclass
class PendingElicitation:
    ask: ElicitationAsk
    request_id: str
    origin: str
    originator: str
    run_id: str | None
    event_id: int
    payload: dict[str, Any]
    future: asyncio.Future[ElicitationAnswer]
    ended: bool = False


class ElicitationRouter:
    """The MCP connections' :data:`~relay_jupyter.mcp.elicitation.ElicitationHandler`: ``await router(ask)``."""

    def __init__(self, events: EventBus, *, audit: Any = None, timeout: float = 300.0,
                 clock: Callable[[], float] = time.time) -> None:
        if not timeout > 0:
            raise ValueError("elicitation timeout must be positive and finite")
        self.events = events
        self.audit = audit
        self.timeout = timeout
        self.clock = clock
        # the pending map, ended ids, who may answer, the answer's first checks: shared with the permission router
        self._book: PendingBook[PendingElicitation] = PendingBook("elicitation")
        self._pending = self._book.pending

    # -- the handler -----------------------------------------------------------------------------

    async def __call__(self, ask: ElicitationAsk) -> ElicitationAnswer:
        ctx = ask.context
        origin = getattr(ctx, "origin", None)
        originator = getattr(ctx, "originator", None)
        run_id = getattr(ctx, "run_id", None)
        request_id = f"el_{secrets.token_hex(8)}"
        base = {"request_id": request_id, "server": ask.server, "tool": ask.tool, "run_id": run_id}
        if ask.refused is not None or not origin or not originator:
            reason = ask.refused or "the call was not started by a notebook that can show a card"
            kind = ask.refused_kind or "context"
            if origin:
                self.events.append(EventType.ELICITATION_RESOLVED,
                                   {**base, "action": "decline", "answered_by": "relay", "refused": reason,
                                    "refused_kind": kind, "answered_at": self.clock()},
                                   origin=origin, run_id=run_id)
            self._audit(origin or "*", ask, "refused" if ask.refused else "decline", "relay", run_id, [], kind)
            return ElicitationAnswer("decline", answered_by="relay", reason=reason)
        now = self.clock()
        deadline = now + self.timeout
        payload = {
            **base,
            "origin": origin,
            "originator": originator,
            "message": ask.message,
            "fields": [f.as_dict() for f in ask.fields],
            "mode": ask.mode,
            "protocol_version": ask.protocol_version,
            "from": "server",
            "deadline": deadline,
        }
        if ask.url is not None:  # URL mode: the link (checked by mcp/elicitation.parse_url_request) and its host
            from urllib.parse import urlsplit

            payload["url"] = ask.url
            payload["url_host"] = (urlsplit(ask.url).hostname or "").encode("idna").decode("ascii")
        event = self.events.append(EventType.ELICITATION_REQUEST, payload, origin=origin, run_id=run_id)
        future: asyncio.Future[ElicitationAnswer] = asyncio.get_running_loop().create_future()
        pending = PendingElicitation(ask=ask, request_id=request_id, origin=origin, originator=originator,
                                     run_id=run_id, event_id=event.id, payload=payload, future=future)
        self._book.add(pending)
        try:
            async with asyncio.timeout(max(0.0, deadline - self.clock())):
                return await asyncio.shield(future)
        except TimeoutError:
            if future.done():
                return future.result()
            return self._resolve(pending, ElicitationAnswer("decline", answered_by="timeout",
                                                            reason=f"no answer within {self.timeout:.0f} s"))
        except asyncio.CancelledError:
            if not pending.ended:
                self._resolve(pending, ElicitationAnswer("cancel", answered_by="cancelled"))
            raise

    # -- answers ---------------------------------------------------------------------------------

    def answer(self, caller: Caller, request_id: str, action: str, content: dict[str, Any] | None = None
               ) -> ElicitationAnswer:
        """Resolve a pending elicitation for ``caller``.

        Raises:
            RoutingRefusal: NOT_FOUND, CONFLICT (ended, or not an action), NOT_ORIGINATOR,
                INVALID_ARGUMENTS (an accept whose values do not fit the form; the request stays open).
        """
        pending = self._book.open_for(
            caller, request_id,
            not_originator="only the notebook whose run called the tool can answer the server's question")
        if action not in ACTIONS:
            raise RoutingRefusal(Code.CONFLICT, "an answer is accept, decline or cancel")
        checked: dict[str, Any] | None = None
        if action == "accept":
            try:
                checked = check_answer(pending.ask.fields, content or {})
            except ValueError as exc:
                raise RoutingRefusal(Code.INVALID_ARGUMENTS, f"the answer does not fit the form: {exc}; "
                                     "the question is still open", data={"request_id": request_id}) from None
        return self._resolve(pending, ElicitationAnswer(action, checked, answered_by=caller.client_id))

    def _resolve(self, pending: PendingElicitation, answer: ElicitationAnswer) -> ElicitationAnswer:
        """End ``pending`` with ``answer`` (synchronously: a second answer in any later tick sees it ended)."""
        self._book.end(pending, answer.action)
        if not pending.future.done():
            pending.future.set_result(answer)
        answered = sorted(answer.content or {})
        data = {"request_id": pending.request_id, "server": pending.ask.server, "tool": pending.ask.tool,
                "run_id": pending.run_id, "action": answer.action, "answered_by": answer.answered_by,
                "answered_at": self.clock(), "fields_answered": answered}
        if answer.reason:
            data["reason"] = answer.reason
        self.events.append(EventType.ELICITATION_RESOLVED, data, origin=pending.origin, run_id=pending.run_id)
        decision = "timeout" if answer.answered_by == "timeout" else answer.action
        self._audit(pending.origin, pending.ask, decision, answer.answered_by, pending.run_id, answered, None)
        return answer

    def _audit(self, origin: str, ask: ElicitationAsk, decision: str, answered_by: str, run_id: str | None,
               answered: list[str], refused_kind: str | None) -> None:
        if self.audit is None:
            return
        arguments: dict[str, Any] = {"server": ask.server, "fields": [f.name for f in ask.fields],
                                     "fields_answered": answered}
        if ask.url is not None:  # the host only: a link may carry a one-time code or state
            from urllib.parse import urlsplit

            arguments["mode"] = "url"
            arguments["url_host"] = urlsplit(ask.url).hostname or ""
        if refused_kind:
            arguments["refused"] = refused_kind
        self.audit.append(AuditRecord(ts=self.clock(), origin=origin, tool=f"elicitation:{ask.tool or ask.server}",
                                      decision=decision, answered_by=answered_by, run_id=run_id,
                                      arguments=arguments))

    # -- queries and bulk actions ----------------------------------------------------------------

    def pending_for(self, caller: Caller) -> list[PendingElicitation]:
        return self._book.for_caller(caller)

    def decline_all(self, origin: str | None = None, *, answered_by: str = "kill") -> int:
        """Decline every pending elicitation (of ``origin``): the kill switch, a broker stop."""
        ended = [p for p in list(self._pending.values()) if origin is None or p.origin == origin]
        for pending in ended:
            self._resolve(pending, ElicitationAnswer("decline", answered_by=answered_by))
        return len(ended)

    def withdraw(self, *, originator: str, reason: str) -> list[str]:
        """Decline every pending elicitation of client ``originator`` (its kernel restarted or died)."""
        ended = [p for p in list(self._pending.values()) if p.originator == originator]
        for pending in ended:
            self._resolve(pending, ElicitationAnswer("decline", answered_by=f"withdrawn:{reason}",
                                                     reason=f"withdrawn: the kernel {reason}"))
        return [p.request_id for p in ended]


def router_of(broker: Any) -> ElicitationRouter:
    """The broker's router, made on first use (``broker.elicitations``) with the consent timeout and
    attached to its MCP registry, so every MCP connection asks through it."""
    router = getattr(broker, "elicitations", None)
    if router is None:
        router = ElicitationRouter(broker.events, audit=broker.audit,
                                   timeout=float(getattr(broker.config, "consent_timeout", 300.0)))
        broker.elicitations = router
    attach = getattr(getattr(broker, "mcp", None), "set_elicitation_handler", None)
    if attach is not None:
        attach(router)
    return router
