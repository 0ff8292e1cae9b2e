"""``telemetry.query``: the per-request telemetry rows (docs/telemetry.md): tokens and cost charged,
latency, time to first token, status, session and lineage of every model request — never text.

Access (:data:`~._access.NOTEBOOK`): a kernel reads its own origin's rows; a browser session every
origin's (or the one it names).
"""

from __future__ import annotations

import asyncio

from ...protocol.models_telemetry import TelemetryQueryParams, TelemetryQueryResult
from ...protocol.names import Method
from ._access import NOTEBOOK, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "telemetry")


@rpc.method(Method.TELEMETRY_QUERY, TelemetryQueryParams, TelemetryQueryResult, scope=Scope.ANY,
            doc="Telemetry rows (newest `limit` since `since`, oldest first): a kernel sees its own origin's only.")
async def telemetry_query(req: Request, params: TelemetryQueryParams) -> TelemetryQueryResult:
    # a worker thread: a query of many rows is storage I/O that must not stall the loop (issue 18)
    prefix = req.prefix(params.origin_prefix)  # in the store: the limit counts matching rows only
    rows = await asyncio.to_thread(req.broker.telemetry.query, origin=req.origin, since=params.since,
                                   limit=params.limit, origin_prefix=prefix)
    return TelemetryQueryResult(rows=req.keep(rows))
