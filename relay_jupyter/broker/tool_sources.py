"""The broker's tool sources, listed once and in one order: the scratch workspace, the kernel bridge,
the MCP registry. Each implements :class:`~relay_jupyter.core.tooling.ToolSource` itself.

Everything that offers or looks up a tool uses :func:`tool_sources` through a
:class:`~relay_jupyter.runtime.tools.ToolIndex` (the first source to offer a name owns it): the
tools a run offers the model and the lookup of each of its calls (the run manager's
:class:`ToolSources`), ``tools.list`` and ``tools.call`` (``broker/methods/tools.py``). So a name
offered by two sources resolves to the same source on every path. A new kind of tool source is
added here, and only here; a source built at run time (tools written as Python functions, an
embedding application's own) is added with :func:`add_tool_source` and comes after the built-in ones.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from ..core.tooling import ToolSource

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["ToolSources", "add_tool_source", "tool_sources"]

# per broker, the sources added with add_tool_source (kept beside the broker, not on it: the broker's
# slots are the built-in components)
_added: weakref.WeakKeyDictionary[Any, list[ToolSource]] = weakref.WeakKeyDictionary()


def tool_sources(broker: Broker) -> list[ToolSource]:
    """The wired tool sources of ``broker``, in the one order: workspace, kernel bridge, MCP, then the
    sources added with :func:`add_tool_source` in the order they were added."""
    out: list[ToolSource] = []
    if broker.workspace_tools is not None:
        out.append(broker.workspace_tools)
    out.append(broker.kernel_bridge)
    if broker.mcp is not None:
        out.append(broker.mcp)
    out.extend(_added.get(broker, ()))
    return out


def add_tool_source(broker: Broker, source: ToolSource) -> None:
    """Offer ``source``'s tools from the next run start and ``tools.call`` on, gated like every other
    tool. It comes after the built-in sources: a name one of them already offers stays theirs.

    Raises:
        TypeError: ``source`` does not implement :class:`~relay_jupyter.core.tooling.ToolSource`.
    """
    if not isinstance(source, ToolSource):
        raise TypeError(f"{type(source).__name__} is not a ToolSource (tool_specs, tool_current, "
                        "tool_preflight, tool_call)")
    _added.setdefault(broker, []).append(source)


class ToolSources(Sequence[ToolSource]):
    """:func:`tool_sources` as a live sequence, read each time it is iterated: the run manager holds it,
    so a component wired after the runtime (the MCP registry once it has connected) is still offered
    from the next run start or ``tools.call`` on."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def __iter__(self) -> Iterator[ToolSource]:
        return iter(tool_sources(self._broker))

    def __len__(self) -> int:
        return len(tool_sources(self._broker))

    @overload
    def __getitem__(self, index: int) -> ToolSource: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[ToolSource]: ...

    def __getitem__(self, index: int | slice) -> ToolSource | Sequence[ToolSource]:
        return tool_sources(self._broker)[index]
