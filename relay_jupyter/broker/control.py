"""Control methods: grants, budgets, audit, runs, kill, permission answers, kernel-tool results, trust.

Who may act on what (one rule, :func:`~relay_jupyter.broker.broker.target_origin`): a kernel acts on
its own origin only; a browser session of the server's user acts on any origin of its server and,
for list methods, may omit the origin to see all of them.
"""

from __future__ import annotations

import inspect
import secrets
import time
from typing import TYPE_CHECKING, Any

from ..core.caller import Caller, CallerKind
from ..core.errors import Code, GateRefusal, RoutingRefusal
from ..core.redact import redact
from ..core.types import AuditRecord, Budget, ConsentDecision, ConsentScope, Grant
from ..protocol.models_control import (
    AuditTailParams,
    AuditTailResult,
    BudgetGetResult,
    CancelledResult,
    Empty,
    GrantResult,
    GrantsCreateParams,
    GrantsGetResult,
    GrantsListResult,
    GrantsRevokeParams,
    KernelToolResultParams,
    KillParams,
    KillResult,
    OkResult,
    OriginParams,
    PermissionAnswerParams,
    PermissionAnswerResult,
    PermissionPendingResult,
    RevokedResult,
    RunsCancelParams,
    RunsGetParams,
    RunsGetResult,
    RunsListParams,
    RunsListResult,
    TrustListResult,
    TrustRevokeParams,
)
from ..protocol.names import EventType, Method
from .registry import method

if TYPE_CHECKING:
    from .broker import Broker

__all__: list[str] = []


def _target(caller: Caller, requested: str | None) -> str:
    from .broker import target_origin

    return target_origin(caller, requested)


def _list_scope(caller: Caller, requested: str | None) -> str | None:
    """Origin filter of a list method: None (everything) only for a browser that names none."""
    if caller.kind is CallerKind.BROWSER and requested is None:
        return None
    return _target(caller, requested)


def _audit(broker: Broker, caller: Caller, origin: str, action: str, arguments: dict[str, Any]) -> None:
    broker.audit.append(AuditRecord(ts=time.time(), origin=origin, tool=action, decision="ok",
                                    answered_by=caller.client_id, arguments=redact(arguments)))


# -- grants --------------------------------------------------------------------------------------

@method(Method.GRANTS_GET, OriginParams, GrantsGetResult,
        doc="The caller's live grant (null when none or expired). Browser: name the origin.")
async def grants_get(broker: Broker, caller: Caller, params: OriginParams) -> GrantsGetResult:
    return GrantsGetResult(grant=broker.grants.get(_target(caller, params.origin)))


@method(Method.GRANTS_CREATE, GrantsCreateParams, GrantResult,
        doc="Connect-card click: grant tools/models/budget to the caller's own origin. The click is the "
            "consent; each call is a fresh consent, so it may replace a narrower grant.")
async def grants_create(broker: Broker, caller: Caller, params: GrantsCreateParams) -> GrantResult:
    origin = _target(caller, params.origin)
    now = time.time()
    grant = Grant(
        origin=origin,
        tools=frozenset(params.tools),
        models=frozenset(params.models),
        budget=params.budget or Budget(),
        expires_at=None if params.expires_in is None else now + params.expires_in,
        created_at=now,
        consent_id=f"consent_{secrets.token_hex(12)}",
    )
    stored = broker.grants.issue(grant)
    _audit(broker, caller, origin, "grant.create",
           {"tools": sorted(grant.tools), "models": sorted(grant.models), "consent_id": grant.consent_id})
    broker.events.append(EventType.GRANT_CHANGED, {"origin": origin, "action": "created"}, origin=origin)
    return GrantResult(grant=stored)


@method(Method.GRANTS_LIST, OriginParams, GrantsListResult,
        doc="Live grants: a kernel sees its own; a browser sees all (or one origin's).")
async def grants_list(broker: Broker, caller: Caller, params: OriginParams) -> GrantsListResult:
    scope = _list_scope(caller, params.origin)
    grants = broker.grants.list()
    return GrantsListResult(grants=[g for g in grants if scope is None or g.origin == scope])


@method(Method.GRANTS_REVOKE, GrantsRevokeParams, RevokedResult,
        doc="Revoke the grant of the caller's origin (browser: of the named origin). Takes effect at once.")
async def grants_revoke(broker: Broker, caller: Caller, params: GrantsRevokeParams) -> RevokedResult:
    origin = _target(caller, params.origin)
    revoked = broker.grants.revoke(origin)
    _audit(broker, caller, origin, "grant.revoke", {"revoked": revoked})
    if revoked:
        broker.events.append(EventType.GRANT_CHANGED, {"origin": origin, "action": "revoked"}, origin=origin)
    return RevokedResult(revoked=revoked)


# -- budget and audit ----------------------------------------------------------------------------

@method(Method.BUDGET_GET, OriginParams, BudgetGetResult,
        doc="Today's usage and limits (tokens, cost, reservations, rate) of the caller's origin.")
async def budget_get(broker: Broker, caller: Caller, params: OriginParams) -> BudgetGetResult:
    origin = _target(caller, params.origin)
    return BudgetGetResult(origin=origin, usage=broker.ledger.usage(origin, broker.grants.get(origin)))


@method(Method.AUDIT_TAIL, AuditTailParams, AuditTailResult,
        doc="The last n audit records (arguments redacted): a kernel sees its own origin's only.")
async def audit_tail(broker: Broker, caller: Caller, params: AuditTailParams) -> AuditTailResult:
    scope = _list_scope(caller, params.origin)
    return AuditTailResult(records=broker.audit.tail(params.n, origin=scope))


# -- runs ----------------------------------------------------------------------------------------

def _visible_run(broker: Broker, caller: Caller, run_id: str) -> dict[str, Any]:
    get_run = getattr(broker.store, "get_run", None)
    run = get_run(run_id) if get_run is not None else None
    if run is None or (caller.kind is not CallerKind.BROWSER and run.get("origin") != caller.origin):
        # the same answer for "missing" and "not yours": existence is not leaked across notebooks
        raise RoutingRefusal(Code.NOT_FOUND, f"no run {run_id}")
    return run


@method(Method.RUNS_LIST, RunsListParams, RunsListResult,
        doc="Runs from the journal, newest first: a kernel sees its own origin's.")
async def runs_list(broker: Broker, caller: Caller, params: RunsListParams) -> RunsListResult:
    scope = _list_scope(caller, params.origin)
    return RunsListResult(runs=broker.store.list_runs(origin=scope, limit=params.limit))


@method(Method.RUNS_GET, RunsGetParams, RunsGetResult, doc="One run with its calls.")
async def runs_get(broker: Broker, caller: Caller, params: RunsGetParams) -> RunsGetResult:
    return RunsGetResult(run=_visible_run(broker, caller, params.run_id))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@method(Method.RUNS_CANCEL, RunsCancelParams, CancelledResult,
        doc="Cancel one run of the caller's origin (browser: any). False when it already ended.")
async def runs_cancel(broker: Broker, caller: Caller, params: RunsCancelParams) -> CancelledResult:
    from .broker import require

    runs = require(broker.runs, "the agent runtime")
    _visible_run(broker, caller, params.run_id)
    return CancelledResult(cancelled=bool(await _maybe_await(runs.cancel(params.run_id))))


@method(Method.KILL, KillParams, KillResult,
        doc="Stop every run of one origin (default: the caller's own) or, browser only, of all origins; "
            "pending permission requests of those runs are denied.")
async def kill(broker: Broker, caller: Caller, params: KillParams) -> KillResult:
    if params.all:
        if caller.kind is not CallerKind.BROWSER:
            raise GateRefusal(Code.UNAUTHORIZED, "only a browser session of the server's user can kill every run")
        origin = None
    else:
        origin = _target(caller, params.origin)
    denied = broker.permissions.deny_all(origin, answered_by=f"kill:{caller.client_id}")
    cancelled = 0
    if broker.runs is not None:
        value = await _maybe_await(broker.runs.kill(origin))
        cancelled = value if isinstance(value, int) else len(value or ())
    _audit(broker, caller, origin or "*", "kill", {"cancelled_runs": cancelled, "denied_requests": denied})
    return KillResult(cancelled_runs=cancelled, denied_requests=denied)


# -- permissions and kernel tools ----------------------------------------------------------------

@method(Method.PERMISSION_ANSWER, PermissionAnswerParams, PermissionAnswerResult,
        doc="Answer a permission request. Only its originator (or the owning browser user) may; others "
            "get NOT_ORIGINATOR; an ended request gives CONFLICT.")
async def permission_answer(broker: Broker, caller: Caller, params: PermissionAnswerParams
                            ) -> PermissionAnswerResult:
    result = broker.permissions.answer(caller, params.request_id, ConsentDecision(params.decision),
                                       ConsentScope(params.scope))
    return PermissionAnswerResult(request_id=params.request_id, decision=result.decision.value,
                                  scope=result.scope.value, answered_by=result.answered_by,
                                  answered_at=result.answered_at)


@method(Method.PERMISSION_PENDING, Empty, PermissionPendingResult,
        doc="Pending permission requests the caller may answer (the permission.request event data).")
async def permission_pending(broker: Broker, caller: Caller, params: Empty) -> PermissionPendingResult:
    return PermissionPendingResult(requests=[{**p.payload, "event_id": p.event_id}
                                             for p in broker.permissions.pending_for(caller)])


@method(Method.KERNEL_TOOL_RESULT, KernelToolResultParams, OkResult,
        doc="A kernel answers a kernel.tool_request sent to it. Other clients get NOT_ORIGINATOR.")
async def kernel_tool_result(broker: Broker, caller: Caller, params: KernelToolResultParams) -> OkResult:
    broker.kernel_bridge.deliver(caller, params.request_id, params.content, params.is_error)
    return OkResult()


# -- trust ---------------------------------------------------------------------------------------

@method(Method.TRUST_LIST, OriginParams, TrustListResult,
        doc="Saved 'always allow for this notebook' trust: (origin, tool, digest, created_at).")
async def trust_list(broker: Broker, caller: Caller, params: OriginParams) -> TrustListResult:
    return TrustListResult(trust=broker.trust.list_trust(_list_scope(caller, params.origin)))


@method(Method.TRUST_REVOKE, TrustRevokeParams, RevokedResult,
        doc="Forget saved trust of the caller's origin: one tool, or every tool when omitted.")
async def trust_revoke(broker: Broker, caller: Caller, params: TrustRevokeParams) -> RevokedResult:
    origin = _target(caller, params.origin)
    count = broker.trust.revoke_trust(origin, params.tool)
    _audit(broker, caller, origin, "trust.revoke", {"tool": params.tool, "count": int(count)})
    return RevokedResult(revoked=bool(count))
