"""``mcp.*``: OAuth sign-in to an HTTP MCP server (docs/mcp.md, "OAuth sign-in"), and MCP prompts for
``%agent --prompt server:name`` (docs/mcp.md, "Prompts").

Access (:data:`~._access.NOTEBOOK`): a kernel or a browser session of the server's user. Signing in is the
user's act for the whole broker (an MCP server's tokens are the user's, not one notebook's); the answer
carries the authorization URL for the card, never a token (tokens stay in the broker's 0600 store).
Prompts act on one origin: only servers that origin's live grant reaches (a tool of that server, or ``*``)
are listed or fetched from, and each fetch is audited with the argument names (never their values).
"""

from __future__ import annotations

import asyncio

from ...core.errors import Code, GateRefusal, Refusal, RoutingRefusal
from ...protocol.models_control import Empty
from ...protocol.models_mcp import (
    McpPromptGetParams,
    McpPromptGetResult,
    McpPromptInfo,
    McpPromptMessage,
    McpPromptsListParams,
    McpPromptsListResult,
    McpServerParams,
    McpSignInResult,
    McpSignInsEntry,
    McpSignInsResult,
    McpSignInWaitParams,
    McpSignOutResult,
)
from ...protocol.names import Method
from ..mcp_signin import announce_sign_in, sign_in_changed, sign_in_of
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
    sign_in = sign_in_of(req.broker)
    if sign_in is None or req.broker.mcp is None:
        raise RoutingRefusal(Code.NOT_FOUND, "OAuth sign-in is available in the Jupyter server only (it needs the "
                                             "redirect route); configure a header token in mcp.json instead")
    if not sign_in.interactive:  # the daemon: no redirect route here; the terminal command has its own
        raise RoutingRefusal(Code.NOT_FOUND, f"this broker cannot take a sign-in redirect: sign in at a terminal "
                                             f"with: jupyter relay mcp-signin {params.server}")
    pending = await req.broker.mcp.start_sign_in(params.server)
    req.audit("mcp.sign_in", {"server": params.server})
    announce_sign_in(req.broker, pending, req.origin)  # mcp.sign_in_changed: the panel refreshes on it
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
    await registry.disconnect(params.server)  # the live session ends with the token (the next connect asks again)
    await registry.refresh(params.server)
    req.audit("mcp.sign_out", {"server": params.server, "signed_out": gone})
    sign_in_changed(req.broker, params.server, "signed_out", req.origin)
    return McpSignOutResult(server=params.server, signed_out=gone)


@rpc.method(Method.MCP_SIGN_INS, Empty, McpSignInsResult, scope=Scope.ANY,
            doc="The HTTP MCP servers that sign in with OAuth here and where each stands (needs_sign_in, pending "
                "with its link, signed_in, unavailable, not_connected): the side panel's 'Sign in to <server>' list.")
async def mcp_sign_ins(req: Request, params: Empty) -> McpSignInsResult:
    sign_in = sign_in_of(req.broker)
    registry = req.broker.mcp
    if sign_in is None or registry is None or not sign_in.interactive:  # the daemon signs in at a terminal
        return McpSignInsResult(servers=[])
    return McpSignInsResult(servers=[McpSignInsEntry(**entry) for entry in registry.sign_ins()])


# -- prompts ---------------------------------------------------------------------------------------------------

#: A prompt argument value is the user's text: bounded like a tool argument.
_MAX_ARGUMENT_CHARS = 8192


def _reachable_servers(req: Request) -> list[str]:
    """The MCP servers the target origin's live grant reaches: it allows ``*`` or at least one tool of the
    server. A notebook that may use none of a server's tools gets none of its prompts (a ``prompts/get`` is a
    request to that server, with the user's text in it)."""
    registry = req.broker.mcp
    grant = req.broker.grants.get(req.target)
    if registry is None or grant is None:
        return []
    names = registry.servers_named()
    if "*" in grant.tools:
        return names
    return [n for n in names if any(t.startswith(f"{n}__") for t in grant.tools)]


def _require_server(req: Request, server: str) -> None:
    if req.broker.mcp is None or server not in req.broker.mcp.servers_named():
        raise RoutingRefusal(Code.NOT_FOUND, f"no MCP server named {server!r} is configured (jupyter relay tools list)")
    if req.broker.grants.get(req.target) is None:
        raise GateRefusal(Code.UNAUTHORIZED, f"{req.target} has no grant: connect this notebook to relay first",
                          data={"origin": req.target})
    if server not in _reachable_servers(req):
        raise GateRefusal(Code.SCOPE_EXCEEDED, f"this notebook's grant allows no tool of the MCP server {server!r}, "
                                            "so its prompts are not offered (add one of its tools to the grant)")


def request_text(messages: list[dict[str, str]]) -> str:
    """A prompt's messages as one run request: a lone user message is its text; otherwise each message is a
    block headed by its role (the run starts from one user request; the server's roles stay visible)."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["text"]
    return "\n\n".join(f"[{m['role']}]\n{m['text']}" for m in messages)


@rpc.method(Method.MCP_PROMPTS_LIST, McpPromptsListParams, McpPromptsListResult,
            doc="The prompts of the MCP servers the notebook's grant reaches (one server, or all).")
async def mcp_prompts_list(req: Request, params: McpPromptsListParams) -> McpPromptsListResult:
    registry = req.broker.mcp
    if params.server is not None:
        _require_server(req, params.server)
        servers = [params.server]
    else:
        servers = _reachable_servers(req)
    prompts: list[McpPromptInfo] = []
    problems: dict[str, str] = {}
    for server in servers:
        try:
            listed = await registry.prompts(server)  # type: ignore[union-attr]
        except Refusal as exc:  # unreachable, hung: that server only
            if params.server is not None:
                raise
            problems[server] = exc.message[:300]
            continue
        prompts += [McpPromptInfo(server=server, **p) for p in listed]
    return McpPromptsListResult(prompts=prompts, problems=problems)


@rpc.method(Method.MCP_PROMPT_GET, McpPromptGetParams, McpPromptGetResult,
            doc="Fetch one MCP prompt with its arguments, as the text of a run's request (%agent --prompt).")
async def mcp_prompt_get(req: Request, params: McpPromptGetParams) -> McpPromptGetResult:
    for key, value in params.arguments.items():
        if not key or len(key) > 100 or len(value) > _MAX_ARGUMENT_CHARS or "\x00" in key + value:
            raise RoutingRefusal(Code.INVALID_ARGUMENTS, f"prompt argument {key[:40]!r}: names of 1-100 characters, "
                                                         f"values of at most {_MAX_ARGUMENT_CHARS} characters, no NUL")
    _require_server(req, params.server)
    audit = {"server": params.server, "prompt": params.name, "arguments": sorted(params.arguments)}
    try:
        got = await req.broker.mcp.prompt(params.server, params.name, dict(params.arguments))  # type: ignore[union-attr]
    except Refusal as exc:
        req.audit("mcp.prompt_get", {**audit, "code": exc.code.value}, decision="error")
        raise
    req.audit("mcp.prompt_get", audit)
    messages = [McpPromptMessage(role=str(m["role"]), text=m["text"]) for m in got["messages"]]
    return McpPromptGetResult(server=params.server, name=params.name, messages=messages,
                              text=request_text(got["messages"]), truncated=bool(got["truncated"]))
