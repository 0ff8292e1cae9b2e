"""``tools.list`` and ``tools.call``: a client-initiated tool call (the page-initiated call of seed 000).

``tools.call`` goes through the SAME gate as a model-proposed call (``Gate.call_tool``: grant,
allowlist, rate, class, consent) with the caller as originator, after the same argument checks
(size cap, JSON Schema). :func:`execute_client_call` is deliberately thin: when the runtime wires
``broker.client_tools`` (its executor's client-call entry), ``tools.call`` goes there instead.
"""

from __future__ import annotations

import inspect
import json
import secrets
from typing import TYPE_CHECKING, Any

from ..core.caller import Caller, CallerKind
from ..core.errors import Code, Refusal, RoutingRefusal
from ..core.types import PermissionMode, ToolClass, ToolRequest, ToolSpec, stricter
from ..protocol.models_control import (
    ToolInfo,
    ToolsCallParams,
    ToolsCallResult,
    ToolsListParams,
    ToolsListResult,
)
from ..protocol.names import Method
from ..runtime.tools import is_daemon_kernel_client
from .conversation_keys import conversation_key
from .registry import method

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["MAX_ARGUMENT_BYTES", "available_tools", "execute_client_call"]

#: Largest serialised arguments object accepted for a tool call.
MAX_ARGUMENT_BYTES = 256 * 1024


def _specs_of(source: Any) -> list[ToolSpec]:
    specs = source.specs()
    return list(specs)


def available_tools(broker: Broker, caller: Caller) -> list[tuple[str, ToolSpec]]:
    """(provider, spec) of every tool the broker can run for ``caller``: kernel tools only for a kernel
    caller (they run in that kernel), workspace and MCP tools when those are wired."""
    out: list[tuple[str, ToolSpec]] = []
    if caller.kind is CallerKind.KERNEL or (caller.kind is CallerKind.DAEMON
                                           and is_daemon_kernel_client(caller.client_id)):
        out += [("kernel", s) for s in broker.kernel_bridge.specs()]
    if broker.workspace_tools is not None:
        out += [("workspace", s) for s in _specs_of(broker.workspace_tools)]
    if broker.mcp is not None:
        out += [("mcp", s) for s in _specs_of(broker.mcp)]
    return out



def _jsonschema() -> Any:
    """``jsonschema``, imported on first use: its import costs seconds on a loaded machine (it pulls
    ``rfc3987_syntax``, which builds a grammar), and the daemon, the CLI and broker start should not pay it."""
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators

    return jsonschema

def _check_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> None:
    size = len(json.dumps(arguments, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_ARGUMENT_BYTES:
        raise Refusal(Code.ARGUMENTS_TOO_LARGE, f"arguments are {size} bytes; the limit is {MAX_ARGUMENT_BYTES}")
    jsonschema = _jsonschema()
    try:
        jsonschema.validate(arguments, spec.input_schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise Refusal(Code.INVALID_ARGUMENTS, f"arguments of {spec.name} are invalid at {where}: "
                      f"{exc.message[:200]}") from None
    except jsonschema.SchemaError:
        raise Refusal(Code.INVALID_ARGUMENTS, f"the tool {spec.name} has an invalid input schema") from None


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and "content" in value:
        return {"content": value["content"], "is_error": bool(value.get("is_error", False))}
    if hasattr(value, "content") and hasattr(value, "is_error"):
        return {"content": value.content, "is_error": bool(value.is_error)}
    return {"content": value, "is_error": False}


async def execute_client_call(broker: Broker, caller: Caller, origin: str, conversation: str, tool: str,
                              arguments: dict[str, Any]) -> dict[str, Any]:
    """Gate and run one client-initiated call; returns ``{content, is_error}``.

    Raises:
        Refusal: UNKNOWN_TOOL, ARGUMENTS_TOO_LARGE, INVALID_ARGUMENTS, and every gate refusal.
    """
    found = next(((p, s) for p, s in available_tools(broker, caller) if s.name == tool), None)
    if found is None:
        raise RoutingRefusal(Code.UNKNOWN_TOOL, f"no tool named {tool!r} is available here")
    provider, spec = found
    _check_arguments(spec, arguments)
    reasons: tuple[str, ...] = ()
    preview: dict[str, Any] = {}
    if provider == "workspace" and hasattr(broker.workspace_tools, "preflight"):
        found_reasons, preview = await broker.workspace_tools.preflight(conversation, tool, arguments,
                                                                        origin=origin)
        reasons = tuple(found_reasons)
        preview = dict(preview)
        cls = preview.pop("tool_class", None)  # a pull outside the read roots is write for this call
        if cls:
            spec = spec.model_copy(update={"tool_class": stricter(spec.tool_class, ToolClass(cls))})
    req = ToolRequest(origin=origin, tool=spec, arguments=arguments, call_id=f"cc_{secrets.token_hex(8)}",
                      conversation=conversation, originator=caller.client_id, mode=PermissionMode.ASK,
                      reasons=reasons, preview=preview)

    async def execute() -> dict[str, Any]:
        if provider == "kernel":
            return await broker.kernel_bridge.call(origin, caller.client_id, tool, arguments)
        if provider == "workspace":
            return _as_dict(await broker.workspace_tools.call(conversation, tool, arguments, origin=origin,
                                                              approved_preview=preview))
        return _as_dict(await _maybe_await(broker.mcp.call(tool, arguments)))

    return await broker.gate.call_tool(req, execute, broker.permissions)


@method(Method.TOOLS_LIST, ToolsListParams, ToolsListResult,
        doc="Every tool the broker can run for the caller, with its class and whether the grant allows it.")
async def tools_list(broker: Broker, caller: Caller, params: ToolsListParams) -> ToolsListResult:
    from .broker import target_origin

    origin = target_origin(caller, params.origin)
    grant = broker.grants.get(origin)
    tools = [
        ToolInfo(name=s.name, tool_class=s.tool_class.value, server=s.server, description=s.description,
                 input_schema=s.input_schema, allowed=grant is not None and grant.allows_tool(s.name))
        for _, s in available_tools(broker, caller)
    ]
    return ToolsListResult(tools=tools)


@method(Method.TOOLS_CALL, ToolsCallParams, ToolsCallResult,
        doc="Call one tool directly (no model). Same gate as a model-proposed call: grant, allowlist, "
            "budget, class, consent from the caller (the originator).")
async def tools_call(broker: Broker, caller: Caller, params: ToolsCallParams) -> ToolsCallResult:
    from .broker import target_origin

    origin = target_origin(caller, params.origin)
    client_tools = getattr(broker, "client_tools", None)
    if client_tools is not None:
        value = await client_tools(caller, origin, params.conversation, params.tool, params.arguments)
    else:
        value = await execute_client_call(broker, caller, origin, conversation_key(origin, params.conversation),
                                          params.tool, params.arguments)
    result = _as_dict(value)
    return ToolsCallResult(content=result["content"], is_error=result["is_error"])

