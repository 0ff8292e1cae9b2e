"""Tool sources for the runtime: the :class:`ToolProvider` protocol, the adapters of the broker's
tool sources (scratch workspace, kernel bridge, MCP registry), and :class:`LocalTools` for tools
written as Python functions (tests, embedding).

A provider describes its tools (:class:`~relay_jupyter.core.types.ToolSpec`: name, schema,
safety class, parallel safety) and runs them; it never decides whether a call may run — the
executor and the gate do. Tool *failures* are results (``is_error=True``), not exceptions.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import shlex
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..core.redact import mask_argv, mask_secret_text
from ..core.types import PermissionMode, ToolClass, ToolSpec, canonical_json

__all__ = [
    "DAEMON_KERNEL_CLIENT",
    "MAX_ARGUMENT_BYTES",
    "KernelToolsProvider",
    "LocalTools",
    "McpToolsProvider",
    "Preflight",
    "ToolContext",
    "ToolIndex",
    "ToolProvider",
    "ToolResult",
    "WorkspaceToolsProvider",
    "as_result",
    "is_daemon_kernel_client",
    "tool_change",
    "tool_identity",
]


#: Largest accepted argument object of a tool call, as JSON bytes (object root).
MAX_ARGUMENT_BYTES = 256 * 1024

#: Longest unified diff of a changed tool put on its consent card (characters).
MAX_TOOL_DIFF_CHARS = 16_000


def tool_identity(spec: ToolSpec) -> str:
    """SHA-256 over everything a tool was classified and approved as: :attr:`ToolSpec.digest`
    (source, name, description, schema) *and* its hints (MCP annotations: a read that turns
    destructive is a different tool) and its ``runs_code`` mark. Run-scoped allows and saved
    trust are bound to it; the executor compares it at every call (docs/mcp.md, "Tool identity")."""
    body = canonical_json([spec.digest, spec.hints, spec.runs_code])
    return hashlib.sha256(body.encode()).hexdigest()


def _shown_source(source: str) -> str:
    """A tool's source as a card may show it: a token on the MCP server's command line is masked (the
    digest keeps the exact command line; docs/mcp.md)."""
    try:
        return shlex.join(mask_argv(shlex.split(source)))
    except ValueError:  # not shell-splittable: mask token shapes in the text itself
        return mask_secret_text(source)


def _shown(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "server": spec.server, "source": _shown_source(spec.source),
            "description": spec.description,
            "input_schema": spec.input_schema, "annotations": spec.hints, "tool_class": spec.tool_class.value}


def tool_change(old: ToolSpec, new: ToolSpec) -> dict[str, Any]:
    """The card's ``tool_changed`` field: both specs as the user can read them, and a unified diff of
    the two as pretty JSON (``difflib``; cut at :data:`MAX_TOOL_DIFF_CHARS`)."""
    a, b = _shown(old), _shown(new)
    diff = "".join(difflib.unified_diff(
        json.dumps(a, indent=2, sort_keys=True, ensure_ascii=False).splitlines(keepends=True),
        json.dumps(b, indent=2, sort_keys=True, ensure_ascii=False).splitlines(keepends=True),
        fromfile="offered", tofile="now", n=2))
    if len(diff) > MAX_TOOL_DIFF_CHARS:
        diff = diff[:MAX_TOOL_DIFF_CHARS] + f"\n[… diff cut at {MAX_TOOL_DIFF_CHARS} characters]\n"
    return {"old": a, "new": b, "diff": diff}


@dataclass(frozen=True)
class ToolContext:
    """Who a call is for. Built by the broker from the authenticated caller, never from the model."""

    origin: str
    conversation: str
    originator: str | None = None
    """Client id that started the run; only it may answer the run's consent requests."""
    run_id: str | None = None
    mode: PermissionMode = PermissionMode.ASK
    user: str | None = None
    caller_kind: str | None = None
    """``kernel`` | ``browser`` | ``daemon``: kernel tools are offered only to runs a kernel started."""


@dataclass(frozen=True)
class Preflight:
    """What a provider found out before the gate: card lines, card data, and a parallel override."""

    reasons: tuple[str, ...] = ()
    preview: dict[str, Any] = field(default_factory=dict)
    parallel_safe: bool | None = None
    """None keeps the spec's value; False makes this call (and so its turn) sequential. A provider
    may only narrow: True never makes a non-parallel tool parallel."""
    tool_class: ToolClass | None = None
    """None keeps the spec's class; otherwise the class of *this call*, which the executor combines
    with the spec's by :func:`~relay_jupyter.core.types.stricter` (a provider can only make a
    call stricter: a pull from outside the read roots, a tool that changed since the run was
    offered it, become ``write``)."""


@dataclass(frozen=True)
class ToolResult:
    """What a call produced (or why it did not run): text for the model plus an error flag."""

    content: str
    is_error: bool = False
    code: str | None = None
    """Refusal code when the call was refused before running (``CONSENT_DENIED``, ``INVALID_ARGUMENTS``…)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Structured extras for clients (a diff, a checkpoint id); not sent to the model."""


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
class ToolProvider(Protocol):
    """A source of tools."""

    def specs(self, ctx: ToolContext) -> Sequence[ToolSpec]:
        """The tools this provider offers to ``ctx`` right now."""

    async def preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """Local checks before the gate. Raise a ``Refusal`` to refuse the call."""

    async def call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                   approved_preview: dict[str, Any]) -> ToolResult:
        """Run the call. ``approved_preview`` is the preview the consent was given for."""

    # Optional: ``async def current(ctx, name) -> ToolSpec | None`` — the tool as its source
    # describes it *now* (the MCP provider re-lists the server). Without it the executor re-reads
    # ``specs(ctx)``. None means the source no longer offers the tool.


Handler = Callable[[dict[str, Any]], Awaitable[Any] | Any]


class LocalTools:
    """Tools written as Python functions: ``LocalTools().add(spec, fn, preflight=None)``.

    ``fn(args)`` (sync or async) returns anything :func:`as_result` accepts; ``preflight(args)``
    returns a :class:`Preflight` or raises a ``Refusal``.
    """

    def __init__(self) -> None:
        self._tools: dict[str, tuple[ToolSpec, Handler, Handler | None]] = {}

    def add(self, spec: ToolSpec, fn: Handler, *, preflight: Handler | None = None) -> LocalTools:
        """Register a tool; a second tool of the same name is an error."""
        if spec.name in self._tools:
            raise ValueError(f"tool {spec.name!r} registered twice")
        self._tools[spec.name] = (spec, fn, preflight)
        return self

    def specs(self, ctx: ToolContext) -> Sequence[ToolSpec]:
        """Every registered tool."""
        return [spec for spec, _, _ in self._tools.values()]

    async def preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """Run the tool's preflight, if it has one."""
        pre = self._tools[name][2]
        if pre is None:
            return Preflight()
        value = pre(args)
        if inspect.isawaitable(value):
            value = await value
        return value if isinstance(value, Preflight) else Preflight()

    async def call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                   approved_preview: dict[str, Any]) -> ToolResult:
        """Run the tool function."""
        value = self._tools[name][1](args)
        if inspect.isawaitable(value):
            value = await value
        return as_result(value)


class WorkspaceToolsProvider:
    """Adapter for the scratch workspace (``workspace.tools.WorkspaceTools``)."""

    def __init__(self, workspace_tools: Any) -> None:
        self._ws = workspace_tools

    def specs(self, ctx: ToolContext) -> Sequence[ToolSpec]:
        """The workspace's tools (class and parallel safety are the workspace's own)."""
        return list(self._ws.specs())

    async def preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """``reasons, preview = await preflight(conversation, tool, args, origin=...)``; a preview key
        ``tool_class`` (a pull outside the read roots: ``write``) becomes this call's class."""
        reasons, preview = await self._ws.preflight(ctx.conversation, name, args, origin=ctx.origin)
        preview = dict(preview or {})
        cls = preview.pop("tool_class", None)
        return Preflight(tuple(reasons or ()), preview, tool_class=ToolClass(cls) if cls else None)

    async def call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                   approved_preview: dict[str, Any]) -> ToolResult:
        """Run a workspace tool; the approval stays bound to the preview (push digests)."""
        value = await self._ws.call(ctx.conversation, name, args, run_id=ctx.run_id, origin=ctx.origin,
                                    approved_preview=approved_preview)
        return as_result(value)


#: The client id of a kernel talking to the standalone daemon (``X-Relay-Client: kernel``). A kernel of a
#: known notebook sends ``kernel:<notebook>`` (client ``daemon:kernel:<notebook>``), so notebooks get
#: their own origin and grants; both are kernel clients (:func:`is_daemon_kernel_client`).
DAEMON_KERNEL_CLIENT = "daemon:kernel"


def is_daemon_kernel_client(client_id: str | None) -> bool:
    """True for a kernel attached to the standalone daemon: ``daemon:kernel`` or ``daemon:kernel:<name>``."""
    return bool(client_id) and (client_id == DAEMON_KERNEL_CLIENT
                                or str(client_id).startswith(DAEMON_KERNEL_CLIENT + ":"))


class KernelToolsProvider:
    """Adapter for the kernel bridge: tools that run in the originating kernel (variables,
    DataFrames, run_code). The bridge routes a call to the kernel of ``ctx.origin`` only."""

    def __init__(self, kernel_bridge: Any) -> None:
        self._bridge = kernel_bridge

    def specs(self, ctx: ToolContext) -> Sequence[ToolSpec]:
        """The kernel tools, when a kernel started the run (they run in that kernel): a kernel of the
        Jupyter server, or a kernel attached to the standalone daemon (client ``daemon:kernel``; every
        client of a daemon is the same user, so the name routes, it does not authorize)."""
        if not ctx.originator or not (ctx.caller_kind == "kernel" or (
                ctx.caller_kind == "daemon" and is_daemon_kernel_client(ctx.originator))):
            return []
        return list(self._bridge.specs())

    async def preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """Kernel tools have no local preflight beyond the schema."""
        return Preflight()

    async def call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                   approved_preview: dict[str, Any]) -> ToolResult:
        """Ask the originating kernel to run the tool and wait for its answer."""
        value = await self._bridge.call(ctx.origin, ctx.originator, name, args, run_id=ctx.run_id)
        return as_result(value)


class McpToolsProvider:
    """Adapter for the MCP registry (``mcp`` layer): ``specs()`` and ``await call(name, args)``."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry

    def specs(self, ctx: ToolContext) -> Sequence[ToolSpec]:
        """Discovered MCP tools, namespaced ``server__tool``, classified by the registry."""
        return list(self._registry.specs())

    async def current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        """The tool as its server lists it now: the registry re-lists the server (reconnecting a
        server that went away), so a tool changed with or without ``tools/list_changed``, or by a
        restart, is seen before the call (registries without ``current`` give their cached view)."""
        current = getattr(self._registry, "current", None)
        if current is None:
            return self._registry.spec(name)
        return await current(name)

    async def preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """Record the digest and annotations of the tool as it is now: the consent is for exactly this
        tool, and :meth:`call` refuses (DIGEST_MISMATCH) if the server changed it while the card was open."""
        spec = self._registry.spec(name)
        return Preflight(preview={"tool_digest": spec.digest, "tool_hints": dict(spec.hints)}
                         if spec is not None else {})

    async def call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                   approved_preview: dict[str, Any]) -> ToolResult:
        """Call the tool on its server (timeouts and output caps are the registry's)."""
        from ..mcp.elicitation import call_context

        digest = approved_preview.get("tool_digest")
        hints = approved_preview.get("tool_hints")
        with call_context(ctx):  # a server's question during this call goes to ctx's notebook (elicitation)
            if hints is None:
                return as_result(await self._registry.call(name, args, expected_digest=digest))
            return as_result(await self._registry.call(name, args, expected_digest=digest, expected_hints=hints))


class ToolIndex:
    """The tools of one run: name -> (provider, spec). The first provider to offer a name owns it;
    a later provider cannot shadow it (MCP names are already namespaced ``server__tool``)."""

    def __init__(self, providers: Iterable[ToolProvider], ctx: ToolContext,
                 allowed: Iterable[str] | None = None) -> None:
        allow = None if allowed is None else set(allowed)
        self._by_name: dict[str, tuple[ToolProvider, ToolSpec]] = {}
        self._baseline: dict[str, ToolSpec] = {}
        for provider in providers:
            for spec in provider.specs(ctx):
                if spec.name in self._by_name:
                    continue
                if allow is not None and spec.name not in allow:
                    continue
                self._by_name[spec.name] = (provider, spec)

    def get(self, name: str) -> tuple[ToolProvider, ToolSpec] | None:
        """Provider and spec of ``name``, or None."""
        return self._by_name.get(name)

    def replace(self, name: str, spec: ToolSpec) -> None:
        """Offer ``spec`` for ``name`` from the next step on (its source changed it mid-run). Only a
        name the run already has, from the same provider: a change never adds a tool to a run."""
        found = self._by_name.get(name)
        if found is not None and spec.name == name:
            self._baseline.setdefault(name, found[1])
            self._by_name[name] = (found[0], spec)

    def baseline(self, name: str) -> ToolSpec | None:
        """The spec a call of ``name`` is compared with: the one the run was offered, or the last
        changed version a person (or the mode) was asked about. A change refused before it reached
        consent (its arguments failed the new schema) stays a change for the next call."""
        found = self._by_name.get(name)
        return self._baseline.get(name, found[1] if found is not None else None)

    def acknowledge(self, name: str, spec: ToolSpec) -> None:
        """``spec`` has been through consent as a changed tool: later calls are compared with it."""
        self._baseline[name] = spec

    def drop(self, name: str) -> None:
        """Stop offering ``name`` (its source no longer lists it)."""
        self._by_name.pop(name, None)
        self._baseline.pop(name, None)

    def specs(self) -> list[ToolSpec]:
        """Every tool of the run, in provider order."""
        return [spec for _, spec in self._by_name.values()]
