"""``budget.get``: today's usage and limits of one notebook (origin).

Access (:data:`~._access.NOTEBOOK`): a kernel reads its own origin's; a browser session names one.
"""

from __future__ import annotations

from ...protocol.models_control import BudgetGetResult, OriginParams
from ...protocol.names import Method
from ._access import NOTEBOOK, Namespace, Request

__all__ = ["ACCESS", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "budget")


@rpc.method(Method.BUDGET_GET, OriginParams, BudgetGetResult,
            doc="Today's usage and limits (tokens, cost, reservations, rate) of the caller's origin.")
async def budget_get(req: Request, params: OriginParams) -> BudgetGetResult:
    origin = req.target
    return BudgetGetResult(origin=origin, usage=req.broker.ledger.usage(origin, req.broker.grants.get(origin)))
