"""``trust.*``: saved "always allow for this notebook" answers.

Access (:data:`~._access.NOTEBOOK`): a kernel lists and forgets its own origin's trust; a browser
session names the origin (``trust.list`` without one: every origin's).
"""

from __future__ import annotations

from ...protocol.models_control import OriginParams, RevokedResult, TrustListResult, TrustRevokeParams
from ...protocol.names import Method
from ._access import NOTEBOOK, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "trust")


@rpc.method(Method.TRUST_LIST, OriginParams, TrustListResult, scope=Scope.ANY,
            doc="Saved 'always allow for this notebook' trust: (origin, tool, digest, created_at).")
async def trust_list(req: Request, params: OriginParams) -> TrustListResult:
    return TrustListResult(trust=req.broker.trust.list_trust(req.origin))


@rpc.method(Method.TRUST_REVOKE, TrustRevokeParams, RevokedResult,
            doc="Forget saved trust of the caller's origin: one tool, or every tool when omitted.")
async def trust_revoke(req: Request, params: TrustRevokeParams) -> RevokedResult:
    count = req.broker.trust.revoke_trust(req.target, params.tool)
    req.audit("trust.revoke", {"tool": params.tool, "count": int(count)})
    return RevokedResult(revoked=bool(count))
