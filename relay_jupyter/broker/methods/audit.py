"""``audit.tail``: the last audit records (arguments redacted).

Access (:data:`~._access.NOTEBOOK`): a kernel sees its own origin's records; a browser session every
origin's (or the one it names).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ...core.types import AuditRecord

from ...protocol.models_control import AuditTailParams, AuditTailResult
from ...protocol.names import Method
from ._access import NOTEBOOK, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "audit")


@rpc.method(Method.AUDIT_TAIL, AuditTailParams, AuditTailResult, scope=Scope.ANY,
            doc="The last n audit records (arguments redacted): a kernel sees its own origin's only.")
async def audit_tail(req: Request, params: AuditTailParams) -> AuditTailResult:
    # a worker thread: reading a big log is file I/O that must not stall the loop (issue 18); the
    # log's tail takes no lock an append needs (storage/audit_log.py)
    prefix = req.prefix(params.origin_prefix)
    where = _matcher(prefix, params.tool, params.decision)  # while the log is read: n counts matching records only
    records = await asyncio.to_thread(req.broker.audit.tail, params.n, origin=req.origin, where=where)
    return AuditTailResult(records=req.keep(records)[-params.n:])


def _matcher(prefix: str | None, tool: str | None, decision: str | None) -> Callable[[AuditRecord], bool] | None:
    if prefix is None and tool is None and decision is None:
        return None

    def where(record: AuditRecord) -> bool:
        return ((prefix is None or record.origin.startswith(prefix)) and (tool is None or record.tool == tool)
                and (decision is None or record.decision == decision))

    return where
