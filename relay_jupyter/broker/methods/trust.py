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

# mcp.discovery (qualified_name, split_name) is imported by the two methods, not with the broker's methods: it
# imports mcp_types (about 0.5 s of CPU), which a daemon's start needs for nothing else (issue 19 "Daemon start")


@rpc.method(Method.TRUST_LIST, OriginParams, TrustListResult, scope=Scope.ANY,
            doc="Saved 'always allow for this notebook' trust: (origin, server, tool, name, digest, created_at).")
async def trust_list(req: Request, params: OriginParams) -> TrustListResult:
    from ...mcp.discovery import qualified_name

    # keyed (origin, server, tool); ``name`` is for display only
    rows = req.keep(req.broker.trust.list_trust(req.origin))
    return TrustListResult(trust=[{**r, "name": qualified_name(r["server"], r["tool"]) if r["server"] else r["tool"]}
                                  for r in rows])


@rpc.method(Method.TRUST_REVOKE, TrustRevokeParams, RevokedResult,
            doc="Forget saved trust of the caller's origin: one tool, or every tool when omitted.")
async def trust_revoke(req: Request, params: TrustRevokeParams) -> RevokedResult:
    trust = req.broker.trust
    if params.tool is None or params.server is not None:
        count = trust.revoke_trust(req.target, server=params.server, tool=params.tool)
    else:  # a name as the model sees it: relay's own tool of that name, and the MCP tool it routes to
        from ...mcp.discovery import split_name

        count = trust.revoke_trust(req.target, server="", tool=params.tool)
        parts = split_name(params.tool)
        if parts is not None:
            count += trust.revoke_trust(req.target, server=parts[0], tool=parts[1])
    req.audit("trust.revoke", {"tool": params.tool, "server": params.server, "count": int(count)})
    return RevokedResult(revoked=bool(count))
