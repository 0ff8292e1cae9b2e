"""Safety classification of tools (docs/gate.md §8): ``read``, ``contained`` or ``write``.

Default-deny: a tool nobody vouched for is ``write``. The base class comes from the
built-in table (our own tools, which we can prove things about) or the user's pins (the
user vouching for an MCP tool). Outside hints — MCP annotations, which a misbehaving
server controls — may only make a class *stricter*, never looser: ``read_only_hint=True``
on an unpinned tool changes nothing; ``destructive_hint=True`` or ``read_only_hint=False``
makes any tool ``write``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .types import ToolClass, stricter

__all__ = ["classify", "hint_class"]

# Hint names as the mcp SDK exposes them (snake_case) and as they travel on the wire (camelCase).
_DESTRUCTIVE = ("destructive_hint", "destructiveHint")
_READ_ONLY = ("read_only_hint", "readOnlyHint")
_EMPTY: Mapping[str, ToolClass | str] = MappingProxyType({})  # immutable default


def hint_class(hints: Mapping[str, Any] | None) -> ToolClass | None:
    """The class outside hints *demand*, or None when they demand nothing.

    Only the strictening direction exists: ``destructive_hint`` set to anything but False/None,
    or ``read_only_hint`` set to anything but True/None, demands ``write``. A value of a wrong
    type counts as the strict reading (fail closed).

    Raises:
        TypeError: ``hints`` is neither None nor a mapping.
    """
    if hints is None:
        return None
    if not isinstance(hints, Mapping):
        raise TypeError("hints must be a mapping or None")
    for key in _DESTRUCTIVE:
        if key in hints and hints[key] is not None and hints[key] is not False:
            return ToolClass.WRITE
    for key in _READ_ONLY:
        if key in hints and hints[key] is not None and hints[key] is not True:
            return ToolClass.WRITE
    return None


def classify(
    tool_name: str,
    *,
    builtin: Mapping[str, ToolClass | str] = _EMPTY,
    pins: Mapping[str, ToolClass | str] = _EMPTY,
    hints: Mapping[str, Any] | None = None,
) -> ToolClass:
    """The safety class of ``tool_name``.

    ``builtin`` (our tools) is authoritative for its names; a user pin for the same name can
    only make it stricter. A pin alone gives the base class of an outside tool. Anything
    else is ``write``. ``hints`` then apply, stricter-only.

    Raises:
        ValueError: ``tool_name`` is empty, or a table holds something that is not a class.
        TypeError: ``tool_name`` is not a str, or ``hints`` is not a mapping.
    """
    if not isinstance(tool_name, str):
        raise TypeError("tool_name must be a str")
    if not tool_name:
        raise ValueError("tool_name must not be empty")
    if tool_name in builtin:
        base = ToolClass(builtin[tool_name])
        if tool_name in pins:
            base = stricter(base, ToolClass(pins[tool_name]))
    elif tool_name in pins:
        base = ToolClass(pins[tool_name])
    else:
        base = ToolClass.WRITE
    return stricter(base, hint_class(hints))
