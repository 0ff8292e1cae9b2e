"""The broker's tool sources, listed once and in one order (workspace, kernel bridge, MCP): the one
module that says which sources a run is offered and who owns a name when two sources offer it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.types import ToolSpec
from ..runtime.tools import (
    KernelToolsProvider,
    McpToolsProvider,
    Preflight,
    ToolContext,
    ToolResult,
    WorkspaceToolsProvider,
)

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["BrokerTools"]


class BrokerTools:
    """One tool provider over the broker's tool slots (workspace, kernel bridge, MCP), read at each
    run start so a component wired after the runtime is still offered."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._owner: dict[str, Any] = {}

    def _providers(self) -> list[Any]:
        b = self._broker
        out: list[Any] = []
        if b.workspace_tools is not None:
            out.append(WorkspaceToolsProvider(b.workspace_tools))
        out.append(KernelToolsProvider(b.kernel_bridge))
        if b.mcp is not None:
            out.append(McpToolsProvider(b.mcp))
        return out

    def specs(self, ctx: ToolContext) -> Sequence[ToolSpec]:
        """Every tool of every wired source (first source wins a name)."""
        specs: list[ToolSpec] = []
        owner: dict[str, Any] = {}
        for provider in self._providers():
            for spec in provider.specs(ctx):
                if spec.name not in owner:
                    owner[spec.name] = provider
                    specs.append(spec)
        # adapters are stateless wrappers over the broker's slots: a newer mapping is always valid
        self._owner.update(owner)
        return specs

    async def current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        """The tool as its source describes it now (the MCP registry re-lists its server): the
        executor compares it with the spec the run was offered before every call."""
        provider = self._owner.get(name)
        if provider is None:
            return None
        current = getattr(provider, "current", None)
        if current is not None:
            return await current(ctx, name)
        return next((s for s in provider.specs(ctx) if s.name == name), None)

    async def preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """Delegate to the tool's source."""
        return await self._owner[name].preflight(ctx, name, args)

    async def call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                   approved_preview: dict[str, Any]) -> ToolResult:
        """Delegate to the tool's source."""
        return await self._owner[name].call(ctx, name, args, approved_preview)
