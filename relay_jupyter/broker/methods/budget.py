"""``budget.get``: today's usage and limits of one notebook (origin).

Access (:data:`~._access.NOTEBOOK`): a kernel reads its own origin's; a browser session names one.
"""

from __future__ import annotations

from ...protocol.models_control import BudgetGetResult, OriginParams
from ...protocol.names import Method
from ...runtime.offload import off_loop
from ._access import NOTEBOOK, Namespace, Request

__all__ = ["ACCESS", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "budget")


@rpc.method(Method.BUDGET_GET, OriginParams, BudgetGetResult,
            doc="Today's usage and limits (tokens, cost, reservations, rate) of the caller's origin.")
async def budget_get(req: Request, params: OriginParams) -> BudgetGetResult:
    origin = req.target
    grant = req.broker.grants.get(origin)
    # the ledger's read on a store thread (runtime/offload.py): PostgreSQL's, or a SQLite store whose reader waits
    return BudgetGetResult(origin=origin, usage=await off_loop(req.broker.ledger.usage, origin, grant))
