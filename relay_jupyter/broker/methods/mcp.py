"""``mcp.*``: OAuth sign-in to an HTTP MCP server (docs/mcp.md, "OAuth sign-in").

Access (:data:`~._access.NOTEBOOK`): a kernel or a browser session of the server's user. Signing in is the
user's act for the whole broker (an MCP server's tokens are the user's, not one notebook's); the answer
carries the authorization URL for the card, never a token (tokens stay in the broker's 0600 store).
"""

from __future__ import annotations

import asyncio

from ...core.errors import Code, RoutingRefusal
from ...protocol.models_mcp import McpServerParams, McpSignInResult, McpSignInWaitParams, McpSignOutResult
from ...protocol.names import Method
from ..mcp_signin import sign_in_of
from ._access import NOTEBOOK, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "mcp")


def _result(pending) -> McpSignInResult:  # type: ignore[no-untyped-def]
    if pending.outcome is not None:
        state = "signed_in" if pending.outcome == "signed_in" else "failed"
        return McpSignInResult(sign_in_id=pending.sign_in_id, server=pending.server, state=state,
                               message=pending.message[:500])
    url = pending.url.result() if pending.url.done() and not pending.url.cancelled() else None
    return McpSignInResult(sign_in_id=pending.sign_in_id, server=pending.server, state="pending",
                           authorization_url=url, message="open the link to sign in")


@rpc.method(Method.MCP_SIGN_IN, McpServerParams, McpSignInResult, scope=Scope.ANY,
            doc="Start signing in to an HTTP MCP server with OAuth: the authorization URL for the card, or "
                "signed_in at once when the broker already holds a valid token.")
async def mcp_sign_in(req: Request, params: McpServerParams) -> McpSignInResult:
    if sign_in_of(req.broker) is None or req.broker.mcp is None:
        raise RoutingRefusal(Code.NOT_FOUND, "OAuth sign-in is available in the Jupyter server only (it needs the "
                                             "redirect route); configure a header token in mcp.json instead")
    pending = await req.broker.mcp.start_sign_in(params.server)
    req.audit("mcp.sign_in", {"server": params.server})
    return _result(pending)


@rpc.method(Method.MCP_SIGN_IN_WAIT, McpSignInWaitParams, McpSignInResult, scope=Scope.ANY,
            doc="Wait (up to timeout seconds) for a sign-in started with mcp.sign_in to finish.")
async def mcp_sign_in_wait(req: Request, params: McpSignInWaitParams) -> McpSignInResult:
    sign_in = sign_in_of(req.broker)
    pending = sign_in.get(params.sign_in_id) if sign_in is not None else None
    if pending is None:
        raise RoutingRefusal(Code.NOT_FOUND, "no such sign-in")
    if pending.task is not None and not pending.task.done():
        await asyncio.wait({pending.task}, timeout=params.timeout)
    return _result(pending)


@rpc.method(Method.MCP_SIGN_OUT, McpServerParams, McpSignOutResult, scope=Scope.ANY,
            doc="Forget the broker's OAuth tokens (and client registration) for an HTTP MCP server.")
async def mcp_sign_out(req: Request, params: McpServerParams) -> McpSignOutResult:
    sign_in = sign_in_of(req.broker)
    registry = req.broker.mcp
    cfg = registry.config.servers.get(params.server) if registry is not None else None
    if sign_in is None or cfg is None or not hasattr(cfg, "url"):
        raise RoutingRefusal(Code.NOT_FOUND, f"no HTTP MCP server named {params.server!r} signs in here")
    gone = sign_in.store(cfg.name, cfg.url).forget()
    await registry.refresh(params.server)
    req.audit("mcp.sign_out", {"server": params.server, "signed_out": gone})
    return McpSignOutResult(server=params.server, signed_out=gone)
