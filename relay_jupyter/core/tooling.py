"""The tool seam: what a source of tools is (:class:`ToolSource`), who a call is for
(:class:`ToolContext`), what a source found out before the gate (:class:`Preflight`), what a call
produced (:class:`ToolResult`), and the one argument bound (:data:`MAX_ARGUMENT_BYTES`).

Pure (stdlib + pydantic via ``core.types``), so every layer that has tools — the scratch workspace,
the MCP registry, the broker's kernel bridge, Python functions in tests — implements
:class:`ToolSource` itself, with no adapter. A source describes its tools and runs them; it never
decides whether a call may run: the executor (``runtime/executor.py``) and the gate do. Tool
*failures* are results (``is_error=True``), not exceptions.

The protocol's methods carry a ``tool_`` prefix so a source keeps its own domain API beside them
(``McpRegistry.call(name, args)``, ``WorkspaceTools.call(conversation, ...)``,
``KernelBridge.call(origin, client, ...)``): the ``tool_*`` methods are its face to the executor.
Which sources the broker offers, and in which order, is said once: ``broker/tool_sources.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .types import PermissionMode, ToolClass, ToolSpec

__all__ = [
    "DAEMON_KERNEL_CLIENT",
    "MAX_ARGUMENT_BYTES",
    "Preflight",
    "ToolContext",
    "ToolResult",
    "ToolSource",
    "as_result",
    "is_daemon_kernel_client",
    "is_hub_kernel_client",
    "offers_kernel_tools",
]

#: Largest accepted argument object of a tool call, as JSON bytes (object root): model-proposed
#: and client-initiated (``tools.call``) calls alike.
MAX_ARGUMENT_BYTES = 256 * 1024

#: The client id of a kernel talking to the standalone daemon (``X-Relay-Client: kernel``). A kernel of a
#: known notebook sends ``kernel:<notebook>`` (client ``daemon:kernel:<notebook>``), so notebooks get
#: their own origin and grants; both are kernel clients (:func:`is_daemon_kernel_client`).
DAEMON_KERNEL_CLIENT = "daemon:kernel"


def is_daemon_kernel_client(client_id: str | None) -> bool:
    """True for a kernel attached to the standalone daemon: ``daemon:kernel`` or ``daemon:kernel:<name>``."""
    return bool(client_id) and (client_id == DAEMON_KERNEL_CLIENT
                                or str(client_id).startswith(DAEMON_KERNEL_CLIENT + ":"))


def is_hub_kernel_client(client_id: str | None) -> bool:
    """True for a user's kernel talking to the JupyterHub service: ``user:<name>/kernel:<notebook>`` (the
    service builds it from the user the hub token belongs to; the label is the user's own: it routes, it does
    not authorize beyond that user)."""
    if not client_id or not client_id.startswith("user:"):
        return False
    user, sep, label = client_id[len("user:"):].partition("/")
    return bool(user) and bool(sep) and label.startswith("kernel:") and len(label) > len("kernel:")


@dataclass(frozen=True)
class ToolContext:
    """Who a call is for. Built by the broker from the authenticated caller, never from the model."""

    origin: str
    conversation: str
    originator: str | None = None
    """Client id that started the run (or made the ``tools.call``); only it may answer the consent."""
    run_id: str | None = None
    mode: PermissionMode = PermissionMode.ASK
    user: str | None = None
    caller_kind: str | None = None
    """``kernel`` | ``browser`` | ``daemon``: kernel tools are offered only to a kernel's calls."""
    kernel: str | None = None
    """The client id of the origin's live kernel that runs kernel tools for a caller that is no kernel: an
    outside MCP client's ``--notebook`` gateway token (broker/mcp_gateway.py). Its consent still goes to
    ``originator`` (None: the side panel), never to that kernel."""


def offers_kernel_tools(ctx: ToolContext) -> bool:
    """Kernel tools run in the kernel that asked: offered when a kernel is the originator — a kernel of
    the Jupyter server, a kernel attached to the standalone daemon (client ``daemon:kernel``; every
    client of a daemon is the same user, so the name routes, it does not authorize), or a user's kernel on
    the JupyterHub service (``user:<name>/kernel:…``: the same, within that user) — or when the broker
    found the origin's one live kernel for an outside gateway client (``ctx.kernel``)."""
    if ctx.kernel:
        return True
    return bool(ctx.originator) and (ctx.caller_kind == "kernel" or (
        ctx.caller_kind == "daemon" and (is_daemon_kernel_client(ctx.originator)
                                         or is_hub_kernel_client(ctx.originator))))


@dataclass(frozen=True)
class Preflight:
    """What a source found out before the gate: card lines, card data, and a parallel override."""

    reasons: tuple[str, ...] = ()
    preview: dict[str, Any] = field(default_factory=dict)
    parallel_safe: bool | None = None
    """None keeps the spec's value; False makes this call (and so its turn) sequential. A source
    may only narrow: True never makes a non-parallel tool parallel."""
    tool_class: ToolClass | None = None
    """None keeps the spec's class; otherwise the class of *this call*, which the executor combines
    with the spec's by :func:`~relay_jupyter.core.types.stricter` (a source can only make a call
    stricter: a pull from outside the read roots, a tool that changed since the run was offered
    it, become ``write``)."""


@dataclass(frozen=True)
class ToolResult:
    """What a call produced (or why it did not run): text for the model plus an error flag."""

    content: str
    is_error: bool = False
    code: str | None = None
    """Refusal code when the call was refused (``CONSENT_DENIED``, ``INVALID_ARGUMENTS``…)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Structured extras for clients (a diff, a checkpoint id; a refusal's plain message and its
    error data); not sent to the model."""


def as_result(value: Any) -> ToolResult:
    """Normalize what a tool returned: a ToolResult, an object with ``content``/``is_error``, a dict
    with those keys, a str, or any JSON value."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(value)
    if isinstance(value, dict) and "content" in value:
        content = value["content"]
        extra = {k: v for k, v in value.items() if k not in ("content", "is_error")}
        return ToolResult(content if isinstance(content, str) else json.dumps(content, default=str),
                          bool(value.get("is_error")), data=extra)
    if hasattr(value, "content") and hasattr(value, "is_error"):
        content = value.content
        return ToolResult(content if isinstance(content, str) else json.dumps(content, default=str),
                          bool(value.is_error))
    return ToolResult(json.dumps(value, default=str))


@runtime_checkable
class ToolSource(Protocol):
    """A source of tools, as the executor uses it. All four methods are required (no probing)."""

    def tool_specs(self, ctx: ToolContext) -> Sequence[ToolSpec]:
        """The tools this source offers to ``ctx`` right now (classified: class and parallel safety)."""
        ...

    async def tool_current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        """The tool ``name`` as this source describes it *now* (the MCP registry re-lists its server):
        the executor compares its identity with the spec the run was offered before every call.
        None when the source no longer offers it. May raise (the call is then refused)."""
        ...

    async def tool_preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """Local checks before the gate (card reasons, card data, a stricter class for this call).
        Raise a ``Refusal`` to refuse the call."""
        ...

    async def tool_call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                        approved_preview: dict[str, Any]) -> ToolResult:
        """Run the call the gate allowed. ``approved_preview`` is the preview the consent was given
        for (push digests, the MCP tool digest): the source refuses if what it would do differs."""
        ...
