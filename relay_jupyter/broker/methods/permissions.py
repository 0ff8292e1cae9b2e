"""``permission.*``: answering the consent cards (permission requests) the broker sent.

Access (:data:`~._access.ADDRESSEE`): a request is answered only by its originator or a browser
session of the server's user; others get ``NOT_ORIGINATOR`` (checked by ``PermissionRouter``, which
holds each request's originator). ``permission.pending`` lists only the requests the caller may answer.
"""

from __future__ import annotations

from ...core.types import ConsentDecision, ConsentScope
from ...protocol.models_control import (
    Empty,
    PermissionAnswerParams,
    PermissionAnswerResult,
    PermissionPendingResult,
)
from ...protocol.names import Method
from ._access import ADDRESSEE, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = ADDRESSEE
rpc = Namespace(ACCESS, "permission")


@rpc.method(Method.PERMISSION_ANSWER, PermissionAnswerParams, PermissionAnswerResult, scope=Scope.ANY,
            doc="Answer a permission request. Only its originator (or the owning browser user) may; others "
                "get NOT_ORIGINATOR; an ended request gives CONFLICT.")
async def permission_answer(req: Request, params: PermissionAnswerParams) -> PermissionAnswerResult:
    result = req.broker.permissions.answer(req.caller, params.request_id, ConsentDecision(params.decision),
                                           ConsentScope(params.scope))
    return PermissionAnswerResult(request_id=params.request_id, decision=result.decision.value,
                                  scope=result.scope.value, answered_by=result.answered_by,
                                  answered_at=result.answered_at)


@rpc.method(Method.PERMISSION_PENDING, Empty, PermissionPendingResult, scope=Scope.ANY,
            doc="Pending permission requests the caller may answer (the permission.request event data).")
async def permission_pending(req: Request, params: Empty) -> PermissionPendingResult:
    return PermissionPendingResult(requests=[{**p.payload, "event_id": p.event_id}
                                             for p in req.broker.permissions.pending_for(req.caller)])
