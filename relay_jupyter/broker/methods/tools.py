"""``tools.*``: ``tools.list`` and ``tools.call``, the tools a caller can use and a client-initiated call
(the page-initiated call of seed 000).

Access (:data:`~._access.NOTEBOOK`): a kernel or daemon client acts on its own origin; a browser
session names the notebook it acts for. Consent for a write is asked of the caller (the originator).

Both use the broker's one list of tool sources (``broker/tool_sources.py``) through a
:class:`~relay_jupyter.runtime.tools.ToolIndex`, as runs do, so a name two sources offer resolves to
the same source everywhere. ``tools.call`` goes through the ONE executor (``runtime/executor.py``):
size bound, the tool re-read from its source, JSON Schema, preflight, gate (grant, allowlist,
budget, class), consent from the caller (the originator), execute, audit; MCP calls bound to the
approved digest and annotations. With the agent runtime installed its run manager's executor serves
the call; without it (a broker with no runtime: tests, embedding) an executor is built over the
broker's own gate, store, events and consent router — never a second pipeline.
"""

from __future__ import annotations

import secrets
import weakref
from typing import TYPE_CHECKING, Any

from ...core.caller import Caller
from ...core.tooling import ToolContext, ToolResult
from ...core.types import ToolSpec
from ...protocol.models_control import (
    ToolInfo,
    ToolsCallParams,
    ToolsCallResult,
    ToolsListParams,
    ToolsListResult,
)
from ...protocol.names import Method
from ...runtime.executor import Executor, refusal_of
from ...runtime.tools import ToolIndex
from ..conversation_keys import conversation_key
from ..tool_sources import tool_sources
from ._access import NOTEBOOK, Namespace, Request

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["ACCESS", "available_tools", "call_tool", "client_context", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "tools")


def client_context(caller: Caller, origin: str, conversation: str = "") -> ToolContext:
    """The context of a client-initiated call: the caller is the originator (only it answers the card),
    ``conversation`` is the client's name, keyed by origin here."""
    return ToolContext(origin=origin, conversation=conversation_key(origin, conversation) if conversation else "",
                       originator=caller.client_id, caller_kind=caller.kind.value, user=caller.user)


def available_tools(broker: Broker, caller: Caller, origin: str | None = None) -> list[ToolSpec]:
    """Every tool the broker can run for ``caller`` (for ``origin``, default the caller's): the same
    sources, order and name resolution as a run (kernel tools only for a kernel caller)."""
    ctx = client_context(caller, origin if origin is not None else (caller.origin or ""))
    return ToolIndex(tool_sources(broker), ctx).specs()


_standalone: weakref.WeakKeyDictionary[Any, Executor] = weakref.WeakKeyDictionary()


def _executor(broker: Broker) -> Executor:
    """The executor of a broker with no runtime, over the broker's gate, store (journal: unused by a
    call without a run), events and consent router (ask mode: the caller answers)."""
    executor = _standalone.get(broker)
    if executor is None:
        def emit(type: str, data: dict[str, Any], ctx: ToolContext) -> None:
            broker.events.append(type, {"run_id": ctx.run_id, **data}, origin=ctx.origin, run_id=ctx.run_id)

        executor = Executor(broker.gate, broker.store, emit, lambda _ctx: broker.permissions)
        _standalone[broker] = executor
    return executor


async def call_tool(broker: Broker, caller: Caller, origin: str, conversation: str, tool: str,
                    arguments: Any) -> ToolResult:
    """Run one client-initiated call through the one executor; always returns a result (a refusal
    is a result with its ``code``)."""
    ctx = client_context(caller, origin, conversation)
    runs = broker.runs
    if runs is not None:
        return await runs.execute_client_call(ctx, tool, arguments)
    return await _executor(broker).execute_client_call(ctx, ToolIndex(tool_sources(broker), ctx), tool, arguments,
                                                       "client_" + secrets.token_hex(8))


@rpc.method(Method.TOOLS_LIST, ToolsListParams, ToolsListResult,
            doc="Every tool the broker can run for the caller, with its class and whether the grant allows it.")
async def tools_list(req: Request, params: ToolsListParams) -> ToolsListResult:
    origin = req.target
    grant = req.broker.grants.get(origin)
    tools = [
        ToolInfo(name=s.name, tool_class=s.tool_class.value, server=s.server, description=s.description,
                 input_schema=s.input_schema, allowed=grant is not None and grant.allows_tool(s.name))
        for s in available_tools(req.broker, req.caller, origin)
    ]
    return ToolsListResult(tools=tools)


@rpc.method(Method.TOOLS_CALL, ToolsCallParams, ToolsCallResult,
            doc="Call one tool directly (no model). Same executor and gate as a model-proposed call: grant, "
                "allowlist, budget, class, consent from the caller (the originator).")
async def tools_call(req: Request, params: ToolsCallParams) -> ToolsCallResult:
    result = await call_tool(req.broker, req.caller, req.target, params.conversation, params.tool, params.arguments)
    refusal = refusal_of(result)
    if refusal is not None:  # refused (before or at the call): a clear RPC error for a direct call
        raise refusal
    return ToolsCallResult(content=result.content, is_error=result.is_error)
