"""``grants.*``: the connect card's grant of tools, models and budget to one notebook (origin).

Access (:data:`~._access.NOTEBOOK`): a kernel acts on its own origin's grant; a browser session names
the origin; ``grants.list`` from a browser that names none lists every origin's grants.
"""

from __future__ import annotations

import secrets
import time

from ...core.types import Budget, Grant
from ...protocol.models_control import (
    GrantResult,
    GrantsCreateParams,
    GrantsDefaultsResult,
    GrantsGetResult,
    GrantsListResult,
    GrantsRevokeParams,
    OriginParams,
    RevokedResult,
)
from ...protocol.names import EventType, Method
from ._access import NOTEBOOK, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "grants")


@rpc.method(Method.GRANTS_GET, OriginParams, GrantsGetResult,
            doc="The caller's live grant (null when none or expired). Browser: name the origin.")
async def grants_get(req: Request, params: OriginParams) -> GrantsGetResult:
    return GrantsGetResult(grant=req.broker.grants.get(req.target))


@rpc.method(Method.GRANTS_DEFAULTS, OriginParams, GrantsDefaultsResult, scope=Scope.ANY,
            doc="What the connect card proposes: the tools it pre-checks (c.RelayApp.default_tools; '*': every "
                "tool offered). The same for every notebook of the server.")
async def grants_defaults(req: Request, params: OriginParams) -> GrantsDefaultsResult:
    return GrantsDefaultsResult(tools=list(req.broker.config.default_tools))


@rpc.method(Method.GRANTS_CREATE, GrantsCreateParams, GrantResult,
            doc="Connect-card click: grant tools/models/budget to the caller's own origin. The click is the "
                "consent; each call is a fresh consent, so it may replace a narrower grant.")
async def grants_create(req: Request, params: GrantsCreateParams) -> GrantResult:
    origin = req.target
    now = time.time()
    grant = Grant(
        origin=origin,
        tools=frozenset(params.tools),
        models=frozenset(params.models),
        proxy_tools=None if params.proxy_tools is None else frozenset(params.proxy_tools),
        profiles=frozenset(params.profiles),
        budget=params.budget or Budget(),
        profile_budgets=tuple(params.profile_budgets),
        expires_at=None if params.expires_in is None else now + params.expires_in,
        created_at=now,
        consent_id=f"consent_{secrets.token_hex(12)}",
    )
    stored = req.broker.grants.issue(grant)
    req.audit("grant.create",
              {"tools": sorted(grant.tools), "models": sorted(grant.models), "consent_id": grant.consent_id,
               **({} if grant.proxy_tools is None else {"proxy_tools": sorted(grant.proxy_tools)}),
               **({"profiles": sorted(grant.profiles)} if grant.profiles else {}),
               **({"profile_budgets": [b.model_dump() for b in grant.profile_budgets]} if grant.profile_budgets
                  else {})})
    req.broker.events.append(EventType.GRANT_CHANGED, {"origin": origin, "action": "created"}, origin=origin)
    return GrantResult(grant=stored)


@rpc.method(Method.GRANTS_LIST, OriginParams, GrantsListResult, scope=Scope.ANY,
            doc="Live grants: a kernel sees its own; a browser sees all (or one origin's).")
async def grants_list(req: Request, params: OriginParams) -> GrantsListResult:
    return GrantsListResult(grants=[g for g in req.broker.grants.list() if req.sees(g.origin)])


@rpc.method(Method.GRANTS_REVOKE, GrantsRevokeParams, RevokedResult,
            doc="Revoke the grant of the caller's origin (browser: of the named origin). Takes effect at once.")
async def grants_revoke(req: Request, params: GrantsRevokeParams) -> RevokedResult:
    origin = req.target
    revoked = req.broker.grants.revoke(origin)
    req.audit("grant.revoke", {"revoked": revoked})
    if revoked:
        req.broker.events.append(EventType.GRANT_CHANGED, {"origin": origin, "action": "revoked"}, origin=origin)
    return RevokedResult(revoked=revoked)
