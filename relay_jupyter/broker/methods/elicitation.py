"""``elicitation.*``: answering the questions MCP servers ask during a tool call (docs/mcp.md, "Elicitation").

Access (:data:`~._access.ADDRESSEE`): a question is answered only by the run's originator or a browser
session of the server's user; others get ``NOT_ORIGINATOR`` (checked by ``ElicitationRouter``, which
holds each question's originator). ``elicitation.pending`` lists only the questions the caller may answer.
"""

from __future__ import annotations

from ...protocol.models_control import Empty
from ...protocol.models_elicitation import ElicitationAnswerParams, ElicitationAnswerResult, ElicitationPendingResult
from ...protocol.names import Method
from ..elicitations import router_of
from ._access import ADDRESSEE, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = ADDRESSEE
rpc = Namespace(ACCESS, "elicitation")


@rpc.method(Method.ELICITATION_ANSWER, ElicitationAnswerParams, ElicitationAnswerResult, scope=Scope.ANY,
            doc="Answer an MCP server's question (accept with the form's values, decline, cancel). Only the "
                "run's originator (or the owning browser user) may; a wrong answer is INVALID_ARGUMENTS.")
async def elicitation_answer(req: Request, params: ElicitationAnswerParams) -> ElicitationAnswerResult:
    answer = router_of(req.broker).answer(req.caller, params.request_id, params.action, params.content)
    return ElicitationAnswerResult(request_id=params.request_id, action=answer.action,
                                   answered_by=answer.answered_by)


@rpc.method(Method.ELICITATION_PENDING, Empty, ElicitationPendingResult, scope=Scope.ANY,
            doc="Pending MCP server questions the caller may answer (the elicitation.request event data).")
async def elicitation_pending(req: Request, params: Empty) -> ElicitationPendingResult:
    return ElicitationPendingResult(requests=[{**p.payload, "event_id": p.event_id}
                                              for p in router_of(req.broker).pending_for(req.caller)])
