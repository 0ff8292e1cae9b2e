"""Classification pins for MCP tools, bound to the tool's digest.

Every MCP tool is ``write`` until the user pins it (``jupyter relay tools pin server__tool read``).
A pin records the class and :attr:`ToolSpec.digest` — SHA-256 over the server's command line
or URL, the tool's name, description and input schema. When any of them changes, the digest no
longer matches: the pin is dropped (deleted from the store, logged by tool name) and the tool
is ``write`` again, so the next call asks for consent again.

Storage is the broker's ``Store`` (``put_pin / get_pin / delete_pin / list_pins``); anything with those
four methods works (:class:`PinStore`). A pin is keyed by ``(server, tool)`` — the server's name and its
own name for the tool (``ToolSpec.key``) — as two separate values, never the joined ``server__tool``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from ..core.errors import Code, ConfigRefusal
from ..core.types import ToolClass, ToolSpec

__all__ = ["PINNABLE_CLASSES", "PinBook", "PinStore"]

logger = logging.getLogger(__name__)

#: MCP tools can be pinned read or write. ``contained`` is for tools the broker itself proves
#: touch only the scratch workspace; an outside server's promise cannot establish that.
PINNABLE_CLASSES = (ToolClass.READ, ToolClass.WRITE)


@runtime_checkable
class PinStore(Protocol):
    """The persistence a :class:`PinBook` needs (implemented by ``storage.sqlite.Store``)."""

    def put_pin(self, server: str, tool: str, digest: str, tool_class: ToolClass | str) -> None: ...
    def get_pin(self, server: str, tool: str) -> tuple[str, ToolClass] | None: ...
    def delete_pin(self, server: str, tool: str) -> bool: ...
    def list_pins(self) -> list[dict[str, Any]]: ...


class PinBook:
    """Pins on top of a :class:`PinStore`: digest binding and dropping of stale pins."""

    def __init__(self, store: PinStore) -> None:
        self.store = store

    def pin(self, spec: ToolSpec, tool_class: ToolClass | str) -> None:
        """Pin the MCP tool ``spec`` to ``tool_class`` at its current digest."""
        try:
            cls = ToolClass(tool_class)
        except ValueError:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"unknown class {tool_class!r}; use read or write") from None
        if cls not in PINNABLE_CLASSES:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"an MCP tool can be pinned read or write, not {cls.value}")
        if spec.server is None:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{spec.name} is not an MCP tool; only MCP tools are pinned")
        self.store.put_pin(*spec.key, spec.digest, cls)

    def unpin(self, server: str, tool: str) -> bool:
        """Remove the pin of ``(server, tool)``; True if there was one."""
        return self.store.delete_pin(server, tool)

    def resolve(self, spec: ToolSpec) -> ToolClass | None:
        """The pinned class of ``spec`` if its pin matches the current digest; a stale pin is deleted."""
        if not spec.server:  # only MCP tools are pinned
            return None
        found = self.store.get_pin(*spec.key)
        if found is None:
            return None
        digest, cls = found
        if digest != spec.digest:
            self.store.delete_pin(*spec.key)
            logger.info("pin of %s dropped: the tool's command/URL, description or schema changed", spec.name)
            return None
        return ToolClass(cls)

    def list(self) -> list[dict[str, Any]]:
        """Every stored pin: ``[{server, tool, digest, tool_class, created_at}]``."""
        return self.store.list_pins()
