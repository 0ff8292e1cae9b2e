"""The gate: the one function every tool call and every model request goes through.

Tool calls (:meth:`Gate.call_tool`), in the order of docs/gate.md §1, fail-closed at each step::

    1 grant      origin has a live grant               else UNAUTHORIZED
    2 scope      tool name in the grant's allowlist     else SCOPE_EXCEEDED
    3 rate       origin's requests-per-minute bucket    else BUDGET_EXCEEDED
    4 class      read / contained run; write runs in mode FULL, otherwise asks the consent
                 port (bounded by ``consent_timeout``)  else CONSENT_DENIED / PERMISSION_TIMEOUT
    5 execute    audit the decision, then run ``execute()``

Model requests (:meth:`Gate.begin_completion` / :meth:`Gate.settle_completion`): grant, model
allowlist, rate, per-run step and token caps (tightened to the live grant's at each request), then
a day reservation of the whole request's bound (tokens and worst-case cost, held in the store);
settled afterwards with what :func:`~relay_jupyter.core.budgets.judge_usage` decides — never more
than the reservation (docs/gate.md §6).

Every decision is audited — refusals included — with arguments only in redacted form. The
allow record is written *before* the tool runs: if the audit sink fails, the tool does not
run. A failing ``execute()`` or a cancellation adds a second record (``error`` /
``cancelled``). The hot path does no I/O but the audit append.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from .budgets import BudgetLedger, RequestEstimate, Reservation, RunBudget, cost_within, judge_usage
from .classify import hint_class
from .errors import Code, GateRefusal, Refusal
from .grants import GrantBook
from .ports import AuditSink, ConsentPort
from .pricing import Pricing
from .redact import redact_arguments
from .types import (
    AuditRecord,
    ConsentDecision,
    ConsentRequest,
    ConsentResult,
    Grant,
    PermissionMode,
    ToolClass,
    ToolRequest,
    Usage,
    stricter,
)

__all__ = ["MODEL_TOOL_PREFIX", "Gate", "profile_of_purpose"]

T = TypeVar("T")

#: Model requests are audited as the tool ``model:<id>``.
MODEL_TOOL_PREFIX = "model:"

_perf = time.perf_counter


def profile_of_purpose(purpose: str | None) -> str | None:
    """The profile a model request's audit purpose names: ``proxy:<name>`` (the model endpoints) or
    ``agent:<name>`` (a ``%%agent --profile`` run), else None."""
    if isinstance(purpose, str):
        kind, sep, name = purpose.partition(":")
        if sep and kind in ("proxy", "agent") and name:
            return name
    return None


def consent_backstop(timeout: float) -> float:
    """Seconds the gate waits past a consent deadline before it gives up on the port itself:
    long enough for the port's own timer (started a moment later) to fire first."""
    return min(5.0, max(0.5, timeout * 0.1))


class Gate:
    """Enforces grants, budgets and consent; audits every decision.

    Args:
        grants: the grant book (narrowing-only grants per origin).
        ledger: day budgets and rate buckets.
        audit: where decision records go (``storage.audit_log.AuditLog`` in the broker).
        pricing: model price table (for reservations and settled cost).
        clock: epoch seconds, used for audit timestamps and consent deadlines.
        consent_timeout: seconds a consent port may take before the call is PERMISSION_TIMEOUT.
    """

    def __init__(self, *, grants: GrantBook, ledger: BudgetLedger, audit: AuditSink, pricing: Pricing,
                 clock: Callable[[], float] = time.time, consent_timeout: float = 300.0) -> None:
        if not consent_timeout > 0:
            raise ValueError("consent_timeout must be positive")
        self.grants = grants
        self.ledger = ledger
        self.audit = audit
        self.pricing = pricing
        self._clock = clock
        self.consent_timeout = float(consent_timeout)

    # -- auditing --------------------------------------------------------------------------
    def _record(self, *, origin: str, tool: str, tool_class: ToolClass | None, decision: str,
                code: str | None, t0: float, run_id: str | None = None, call_id: str | None = None,
                answered_by: str | None = None, arguments: dict[str, Any] | None = None) -> AuditRecord:
        # The public constructor (validated): a gate decision is microseconds in a request that takes
        # seconds, so no hand-built pydantic objects here (issues 14.7 and 18.6).
        rec = AuditRecord(ts=self._clock(), origin=origin, tool=tool, tool_class=tool_class, decision=decision,
                          code=code, duration_ms=(_perf() - t0) * 1000.0, run_id=run_id, call_id=call_id,
                          answered_by=answered_by, arguments=arguments if arguments is not None else {})
        return self.audit.append(rec)

    def _refuse(self, req: ToolRequest, cls: ToolClass | None, refusal: Refusal, t0: float,
                args: dict[str, Any], answered_by: str | None = None) -> Refusal:
        self._record(origin=req.origin, tool=req.tool.name, tool_class=cls, decision="deny",
                     code=refusal.code.value, t0=t0, run_id=req.run_id, call_id=req.call_id,
                     answered_by=answered_by, arguments=args)
        return refusal

    # -- tool calls ------------------------------------------------------------------------
    async def call_tool(self, req: ToolRequest, execute: Callable[[], Awaitable[T]], consent: ConsentPort) -> T:
        """Gate ``req``; if allowed, run ``execute()`` and return its result.

        Raises:
            GateRefusal: UNAUTHORIZED, SCOPE_EXCEEDED, BUDGET_EXCEEDED, CONSENT_DENIED, PERMISSION_TIMEOUT.
            pydantic.ValidationError: ``req`` is not a ToolRequest and does not validate as one.
            asyncio.CancelledError: cancelled while waiting for consent or executing (audited).
            Exception: whatever ``execute()`` raised (audited as ``error``).
        """
        t0 = _perf()
        if not isinstance(req, ToolRequest):
            req = ToolRequest.model_validate(req)
        if not callable(execute):
            raise TypeError("execute must be a callable returning an awaitable")
        args = redact_arguments(req.arguments)
        name = req.tool.name

        grant = self.grants.get(req.origin)
        if grant is None:
            raise self._refuse(req, None, GateRefusal(
                Code.UNAUTHORIZED, f"{req.origin} has no grant: connect this notebook to relay first",
                data={"origin": req.origin}), t0, args)
        if not grant.allows_tool(name):
            raise self._refuse(req, None, GateRefusal(
                Code.SCOPE_EXCEEDED, f"the tool {name!r} is not in this notebook's grant",
                data={"tool": name}), t0, args)
        try:
            self.ledger.take_request(req.origin, grant)
        except GateRefusal as refusal:
            raise self._refuse(req, None, refusal, t0, args) from None

        # Outside hints can only make the class stricter than what the registry resolved.
        cls = stricter(req.tool.tool_class, hint_class(req.tool.hints)) if req.tool.hints else req.tool.tool_class
        answered_by: str | None = None
        if cls is ToolClass.WRITE:
            if req.mode is PermissionMode.FULL:
                answered_by = "mode:full"
            else:
                answered_by = await self._ask(req, cls, consent, t0, args)
        else:
            answered_by = f"class:{cls.value}"

        self._record(origin=req.origin, tool=name, tool_class=cls, decision="allow", code=None, t0=t0,
                     run_id=req.run_id, call_id=req.call_id, answered_by=answered_by, arguments=args)
        try:
            return await execute()
        except asyncio.CancelledError:
            self._record(origin=req.origin, tool=name, tool_class=cls, decision="cancelled",
                         code=Code.CANCELLED.value, t0=t0, run_id=req.run_id, call_id=req.call_id,
                         answered_by=answered_by, arguments=args)
            raise
        except Exception as exc:
            code = exc.code.value if isinstance(exc, Refusal) else Code.TOOL_ERROR.value
            self._record(origin=req.origin, tool=name, tool_class=cls, decision="error", code=code, t0=t0,
                         run_id=req.run_id, call_id=req.call_id, answered_by=answered_by, arguments=args)
            raise

    async def _ask(self, req: ToolRequest, cls: ToolClass, consent: ConsentPort, t0: float,
                   args: dict[str, Any]) -> str:
        """Ask ``consent`` about a write; returns who allowed it or raises the refusal (audited)."""
        creq = ConsentRequest(request_id=uuid.uuid4().hex, request=req,
                              deadline=self._clock() + self.consent_timeout)
        try:
            # The port's own deadline decides (the PermissionRouter emits permission_timeout and one
            # permission.resolved "timeout"); this timer is only a backstop for a port that ignores
            # its deadline, so it fires a margin later and never cancels a port that keeps it.
            async with asyncio.timeout(self.consent_timeout + consent_backstop(self.consent_timeout)):
                result = await consent.ask(creq)
        except TimeoutError:
            raise self._refuse(req, cls, GateRefusal(
                Code.PERMISSION_TIMEOUT, f"no answer to the permission request for {req.tool.name!r} "
                f"within {self.consent_timeout:g}s; denied", data={"request_id": creq.request_id}),
                t0, args, answered_by="timeout") from None
        except asyncio.CancelledError:
            self._record(origin=req.origin, tool=req.tool.name, tool_class=cls, decision="cancelled",
                         code=Code.CANCELLED.value, t0=t0, run_id=req.run_id, call_id=req.call_id,
                         arguments=args)
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the port must deny, never fail open
            raise self._refuse(req, cls, GateRefusal(
                Code.CONSENT_DENIED, f"the permission request for {req.tool.name!r} failed "
                f"({type(exc).__name__}); denied", data={"request_id": creq.request_id}),
                t0, args, answered_by=f"error:{type(exc).__name__}") from None

        if not isinstance(result, ConsentResult):
            raise self._refuse(req, cls, GateRefusal(
                Code.CONSENT_DENIED, f"malformed answer to the permission request for {req.tool.name!r}; "
                "denied", data={"request_id": creq.request_id}), t0, args, answered_by="error:malformed")
        who = result.answered_by or "consent"
        if result.decision is ConsentDecision.ALLOW:
            return who
        if result.decision is ConsentDecision.TIMEOUT:
            raise self._refuse(req, cls, GateRefusal(
                Code.PERMISSION_TIMEOUT, f"the permission request for {req.tool.name!r} timed out; denied",
                data={"request_id": creq.request_id}), t0, args, answered_by=who)
        raise self._refuse(req, cls, GateRefusal(
            Code.CONSENT_DENIED, f"permission to run {req.tool.name!r} was denied",
            data={"request_id": creq.request_id, "reason": result.reason}), t0, args, answered_by=who)

    # -- model requests --------------------------------------------------------------------
    def _grant_for(self, origin: str) -> Grant:
        grant = self.grants.get(origin)
        if grant is None:
            raise GateRefusal(Code.UNAUTHORIZED, f"{origin} has no grant: connect this notebook to relay first",
                              data={"origin": origin})
        return grant

    def begin_completion(self, origin: str, model: str, *, estimated_tokens: int | None = None,
                         estimate: RequestEstimate | None = None, run: RunBudget | None = None,
                         purpose: str | None = None, asked_output: int | None = None,
                         profile: str | None = None) -> Reservation:
        """Check and reserve budget for one model request; audited as tool ``model:<id>``.

        ``profile``: the named upstream the request goes to (docs/proxy.md "Profiles"), whose day limits in the
        grant (``Grant.profile_budgets``) it must fit besides the grant's own; without it, the profile the
        ``purpose`` names (``proxy:<name>`` from the model endpoints, ``agent:<name>`` from a ``--profile`` run:
        :func:`profile_of_purpose`), so every caller that audits a profile is also held to its budget.

        ``estimate`` (from :func:`~relay_jupyter.core.budgets.estimate_request`: the whole request plus
        ``max_tokens``) sizes the reservation — its tokens, and its cost at the model's highest input
        rate for the input and the output rate for ``max_tokens`` — and bounds what the request can be
        charged at :meth:`settle_completion`. ``estimated_tokens`` alone (the reviewer's meter) reserves
        that many tokens at the model's highest rate.

        ``purpose="review"`` marks a request the broker makes on the origin's behalf with a model
        of its own configuration (the review-mode reviewer): it is charged to the origin's rate and
        day budgets like any request, but the grant's model allowlist is not applied — the caller
        did not choose that model. The purpose is recorded in the audit arguments.

        Raises:
            GateRefusal: UNAUTHORIZED, SCOPE_EXCEEDED (names the model), BUDGET_EXCEEDED.
            ValueError: ``estimated_tokens`` is negative or not an int, or neither it nor ``estimate`` given.
        """
        t0 = _perf()
        if not isinstance(origin, str) or not isinstance(model, str) or not model:
            raise TypeError("origin and model must be non-empty str")
        if estimate is not None:
            if not isinstance(estimate, RequestEstimate):
                raise TypeError("estimate must be a RequestEstimate")
            estimated_tokens = estimate.total
        if not isinstance(estimated_tokens, int) or isinstance(estimated_tokens, bool) or estimated_tokens < 0:
            raise ValueError("estimated_tokens must be a non-negative int")
        tool = MODEL_TOOL_PREFIX + model
        audit_args: dict[str, Any] = {"estimated_tokens": estimated_tokens}
        if estimate is not None:
            audit_args["estimated_input_tokens"] = estimate.input_tokens
            audit_args["max_output_tokens"] = estimate.max_output
        if purpose is not None:
            audit_args["purpose"] = str(purpose)[:40]
        if asked_output is not None and estimate is not None and asked_output != estimate.max_output:
            # the request's max_tokens was lowered to what its budgets still allow (completion_room)
            audit_args["max_tokens_asked"] = int(asked_output)
        try:
            grant = self._grant_for(origin)
            if purpose != "review" and not grant.allows_model(model):
                raise GateRefusal(Code.SCOPE_EXCEEDED, f"the model {model!r} is not in this notebook's grant",
                                  data={"model": model})
            self.ledger.take_request(origin, grant)
            if run is not None:
                # the live grant's caps, not only those of the run's start (a narrowed grant binds now)
                run.narrow_to(grant.budget.max_steps_per_run, grant.budget.max_tokens_per_run)
                run.check_step()
                run.check_tokens(estimated_tokens)
            cost = (self.pricing.bound(model, estimate.input_tokens, estimate.max_output) if estimate is not None
                    else self.pricing.estimate(model, estimated_tokens))
            to = profile if profile is not None else profile_of_purpose(purpose)
            reservation = self.ledger.reserve(origin, grant, tokens=estimated_tokens, cost_usd=cost,
                                              estimate=estimate, profile=to)
            if run is not None:
                try:
                    run.step()
                except GateRefusal:
                    reservation.release()
                    raise
        except GateRefusal as refusal:
            self._record(origin=origin, tool=tool, tool_class=None, decision="deny", code=refusal.code.value,
                         t0=t0, arguments=audit_args)
            raise
        try:
            self._record(origin=origin, tool=tool, tool_class=None, decision="allow", code=None, t0=t0,
                         arguments={**audit_args, "reserved_usd": round(cost, 6)})
        except BaseException:
            reservation.release()  # not audited: the request must not go out
            raise
        return reservation

    def completion_room(self, origin: str, model: str, input_tokens: int, run: RunBudget | None = None, *,
                        profile: str | None = None) -> int | None:
        """The most output tokens a request of ``input_tokens`` in could reserve now: what the run's token cap
        (narrowed to the live grant's), the origin's day token and cost budgets and the day and month token and
        cost budgets of each of its teams (what they leave with the team's holds in flight) leave after that
        input; None when no such limit applies. Below 0 when not even the input fits. Advisory: it reserves
        nothing, and :meth:`begin_completion` still checks every limit atomically, so a request sized by it is
        at most refused (another member's request took the team's room first), never over a budget."""
        grant = self.grants.get(origin)
        if grant is None:
            return None
        budget = grant.budget
        rooms: list[int] = []
        if run is not None:
            cap = run.max_tokens
            if budget.max_tokens_per_run is not None:
                cap = budget.max_tokens_per_run if cap is None else min(cap, budget.max_tokens_per_run)
            if cap is not None:
                rooms.append(int(cap) - run.tokens - input_tokens)
        if budget.tokens_per_day is not None or budget.cost_per_day_usd is not None:
            day = self.ledger.usage(origin, grant)
            if budget.tokens_per_day is not None:
                rooms.append(int(budget.tokens_per_day) - day["tokens"] - day["reserved_tokens"] - input_tokens)
            if budget.cost_per_day_usd is not None:
                left = float(budget.cost_per_day_usd) - day["cost_usd"] - day["reserved_cost_usd"]
                room = self._cost_room(model, input_tokens, left)
                if room is not None:
                    rooms.append(room)
        capped = [p for p in self.ledger.profile_usage(origin, grant) if p["profile"] == profile] if profile \
            else []  # the profile's own day limits (Grant.profile_budgets)
        for team in [*self.ledger.team_usage(origin), *capped]:  # remaining: holds in flight counted
            if team.get("remaining_tokens") is not None:
                rooms.append(int(team["remaining_tokens"]) - input_tokens)
            if team.get("remaining_cost_usd") is not None:
                room = self._cost_room(model, input_tokens, float(team["remaining_cost_usd"]))
                if room is not None:
                    rooms.append(room)
        return min(rooms) if rooms else None

    def _cost_room(self, model: str, input_tokens: int, left: float) -> int | None:
        """The most output tokens whose cost, with ``input_tokens`` in, fits ``left`` dollars: -1 when not even the
        input fits (NaN too: fail closed), None when output is free."""
        output_rate = self.pricing.price(model).output
        base = self.pricing.bound(model, max(0, input_tokens), 0)
        if not base <= left:
            return -1
        if not output_rate > 0:
            return None
        out = int((left - base) * 1_000_000.0 / output_rate)
        while out > 0 and not self.pricing.bound(model, max(0, input_tokens), out) <= left:
            out -= 1 + out // 1000  # float rounding at the edge: step down until it fits
        return out

    def settle_completion(self, reservation: Reservation, model: str, usage: Usage | None,
                          run: RunBudget | None = None, *, outcome: str = "complete",
                          streamed_output_tokens: int = 0) -> float:
        """Charge a request begun with :meth:`begin_completion`; returns the cost charged.

        What is charged is decided by :func:`~relay_jupyter.core.budgets.judge_usage` and never exceeds
        the reservation: reported usage within the request's bounds as reported; absurd usage (negative,
        input above the estimate, output above ``max_tokens``) the reservation, audited ``clamped`` with
        the reported figures; no usage (``usage`` None or all zero: a llama.cpp server streaming) the
        input estimate plus ``streamed_output_tokens``, audited ``estimated``; ``outcome`` other than
        ``complete`` (see ``judge_usage``) the reservation, the input estimate or nothing.

        Raises:
            TypeError: ``reservation`` or ``usage`` of the wrong type.
        """
        t0 = _perf()
        if not isinstance(reservation, Reservation):
            raise TypeError("reservation must come from begin_completion()")
        if usage is not None and not isinstance(usage, Usage):
            usage = Usage.model_validate(usage)
        charge = judge_usage(reservation.tokens, reservation.estimate, usage, outcome=outcome,
                             streamed_output_tokens=streamed_output_tokens)
        if charge.usage is None:
            cost = reservation.cost_usd
        elif charge.basis in ("estimated", "input_estimate"):
            cost = self.pricing.bound(model, charge.usage.input_tokens + charge.usage.cache_creation_input_tokens
                                      + charge.usage.cache_read_input_tokens, charge.usage.output_tokens)
        else:
            cost = self.pricing.cost(model, charge.usage)
        cost = cost_within(cost, reservation.cost_usd)
        first = not reservation.done
        reservation.settle(charge.tokens, cost)
        if first:
            reservation.charge, reservation.charged_usd = charge, cost
        if run is not None and first:
            run.add_tokens(charge.tokens)
        if first:
            args: dict[str, Any] = {"tokens": charge.tokens, "cost_usd": round(cost, 6), "basis": charge.basis}
            if charge.reported is not None:
                args["reported"] = charge.reported
            if outcome != "complete":
                args["outcome"] = str(outcome)[:20]
            self._record(origin=reservation.origin, tool=MODEL_TOOL_PREFIX + model, tool_class=None,
                         decision="settled", code=None, t0=t0, arguments=args)
        return cost

    def allowed_tools(self, origin: str, names: Iterable[str]) -> list[str]:
        """The ``names`` the live grant of ``origin`` allows, in their order: the capability set a run
        offers the model (docs/security.md). No grant (or an expired one) allows nothing — fail closed;
        :meth:`call_tool` still refuses, and audits, any call outside the grant."""
        grant = self.grants.get(origin)
        if grant is None:
            return []
        return [n for n in names if grant.allows_tool(n)]

    def run_budget(self, origin: str) -> RunBudget:
        """Fresh per-run caps from the live grant of ``origin``.

        Raises:
            GateRefusal: UNAUTHORIZED when ``origin`` has no live grant.
        """
        budget = self._grant_for(origin).budget
        return RunBudget(budget.max_steps_per_run, budget.max_tokens_per_run)
