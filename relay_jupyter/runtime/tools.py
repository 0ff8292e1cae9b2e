"""Tools in the runtime: the identity of a tool (:func:`tool_identity`, :func:`tool_change`), the
index of one run's tools (:class:`ToolIndex`: the first source to offer a name owns it), and
:class:`LocalTools` for tools written as Python functions (tests, embedding).

The seam itself — :class:`~relay_jupyter.core.tooling.ToolSource`, ``ToolContext``, ``Preflight``,
``ToolResult``, the argument bound — is ``core/tooling.py`` (re-exported here): the scratch workspace,
the kernel bridge and the MCP registry implement it themselves; which of them the broker offers, in
which order, is ``broker/tool_sources.py``.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import shlex
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from ..core.redact import mask_argv, mask_secret_text
from ..core.tooling import (
    DAEMON_KERNEL_CLIENT,
    MAX_ARGUMENT_BYTES,
    Preflight,
    ToolContext,
    ToolResult,
    ToolSource,
    as_result,
    is_daemon_kernel_client,
)
from ..core.types import ToolSpec, canonical_json

__all__ = [
    "DAEMON_KERNEL_CLIENT",
    "MAX_ARGUMENT_BYTES",
    "LocalTools",
    "Preflight",
    "ToolContext",
    "ToolIndex",
    "ToolResult",
    "ToolSource",
    "as_result",
    "is_daemon_kernel_client",
    "tool_change",
    "tool_identity",
]


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

    def tool_specs(self, ctx: ToolContext) -> Sequence[ToolSpec]:
        """Every registered tool."""
        return [spec for spec, _, _ in self._tools.values()]

    async def current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        """The registered spec of ``name`` (override to model a source whose tool changes)."""
        found = self._tools.get(name)
        return found[0] if found is not None else None

    async def tool_current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        """:meth:`current`."""
        return await self.current(ctx, name)

    async def tool_preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """Run the tool's preflight, if it has one."""
        pre = self._tools[name][2]
        if pre is None:
            return Preflight()
        value = pre(args)
        if inspect.isawaitable(value):
            value = await value
        return value if isinstance(value, Preflight) else Preflight()

    async def tool_call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                        approved_preview: dict[str, Any]) -> ToolResult:
        """Run the tool function."""
        value = self._tools[name][1](args)
        if inspect.isawaitable(value):
            value = await value
        return as_result(value)


class ToolIndex:
    """The tools of one run: name -> (source, spec). The first source to offer a name owns it;
    a later source cannot shadow it (MCP names are already namespaced ``server__tool``)."""

    def __init__(self, sources: Iterable[ToolSource], ctx: ToolContext,
                 allowed: Iterable[str] | None = None) -> None:
        allow = None if allowed is None else set(allowed)
        self._by_name: dict[str, tuple[ToolSource, ToolSpec]] = {}
        self._baseline: dict[str, ToolSpec] = {}
        for source in sources:
            for spec in source.tool_specs(ctx):
                if spec.name in self._by_name:
                    continue
                if allow is not None and spec.name not in allow:
                    continue
                self._by_name[spec.name] = (source, spec)

    def get(self, name: str) -> tuple[ToolSource, ToolSpec] | None:
        """Source and spec of ``name``, or None."""
        return self._by_name.get(name)

    def replace(self, name: str, spec: ToolSpec) -> None:
        """Offer ``spec`` for ``name`` from the next step on (its source changed it mid-run). Only a
        name the run already has, from the same source: a change never adds a tool to a run."""
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
        """Every tool of the run, in source order."""
        return [spec for _, spec in self._by_name.values()]
