"""``audit.tail``: the last audit records (arguments redacted).

Access (:data:`~._access.NOTEBOOK`): a kernel sees its own origin's records; a browser session every
origin's (or the one it names).
"""

from __future__ import annotations

import asyncio

from ...protocol.models_control import AuditTailParams, AuditTailResult
from ...protocol.names import Method
from ._access import NOTEBOOK, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "audit")
_MOST = 1000  # AuditTailParams.n's maximum


@rpc.method(Method.AUDIT_TAIL, AuditTailParams, AuditTailResult, scope=Scope.ANY,
            doc="The last n audit records (arguments redacted): a kernel sees its own origin's only.")
async def audit_tail(req: Request, params: AuditTailParams) -> AuditTailResult:
    # a worker thread: reading a big log is file I/O that must not stall the loop (issue 18); the
    # log's tail takes no lock an append needs (storage/audit_log.py)
    records = await asyncio.to_thread(req.broker.audit.tail, req.reach(params.n, _MOST), origin=req.origin)
    return AuditTailResult(records=req.keep(records)[-params.n:])
