"""The MCP protocol versions relay speaks, and what each one lets a server do.

The MCP SDK (mcp 2.3) negotiates: ``server/discover`` first (2026-07-28), falling back to the
``initialize`` handshake, where a server answers with the newest version it has. relay accepts every
version the official SDKs still speak and uses, per connection, only the features that version has:

============  ==============================================================================
2025-03-26    tools, tool annotations, ``tools/list_changed``, Streamable HTTP (MCP SDK 1.9 era)
2025-06-18    + structured tool results, form elicitation (``elicitation/create``), resource links
2025-11-25    + URL elicitation (used: a card with the link), icons, tasks (not used)
2026-07-28    the per-request envelope (``server/discover``), ``subscriptions/listen``
============  ==============================================================================

``2024-11-05`` (the first revision: no annotations, the legacy SSE transport) and anything else are
refused with a message naming the version. A server on an older version works for tools; its
feature set is what its version has, whatever it claims: an elicitation from a 2025-03-26 server is
declined, structured content from one is dropped (a server cannot widen its own powers by sending
messages its negotiated version does not have).
"""

from __future__ import annotations

__all__ = [
    "FEATURES",
    "LATEST",
    "MODERN_VERSIONS",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "has",
    "refusal_message",
    "version_note",
]

SUPPORTED_PROTOCOL_VERSIONS: tuple[str, ...] = ("2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28")
LATEST = SUPPORTED_PROTOCOL_VERSIONS[-1]
MODERN_VERSIONS: tuple[str, ...] = ("2026-07-28",)
"""Versions with the per-request envelope (``server/discover``, ``subscriptions/listen``)."""

_BASE = frozenset({"tools", "tool_annotations", "list_changed_notification"})
_V0618 = _BASE | {"structured_content", "elicitation_form", "resource_links"}
_V1125 = _V0618 | {"elicitation_url", "icons", "tasks"}
FEATURES: dict[str, frozenset[str]] = {
    "2025-03-26": _BASE,
    "2025-06-18": _V0618,
    "2025-11-25": _V1125,
    "2026-07-28": (_V1125 - {"list_changed_notification"}) | {"subscriptions_listen", "discover"},
}

_NOTES = {
    "2025-03-26": "older protocol 2025-03-26: tools work; no structured results and no elicitation",
    "2025-06-18": "older protocol 2025-06-18: tools and form elicitation work; no URL elicitation",
}


def has(version: str | None, feature: str) -> bool:
    """Whether a server that negotiated ``version`` may use ``feature`` (unknown versions: nothing)."""
    return version is not None and feature in FEATURES.get(version, frozenset())


def version_note(version: str | None) -> str | None:
    """The one-line note ``jupyter relay tools list`` prints for a server on an older version, else None."""
    return _NOTES.get(version or "")


def refusal_message(server: str, version: str) -> str:
    shown = "".join(ch for ch in str(version)[:40] if ch.isprintable())
    return (f"MCP server {server!r} speaks protocol {shown!r}; relay supports "
            + ", ".join(SUPPORTED_PROTOCOL_VERSIONS))
