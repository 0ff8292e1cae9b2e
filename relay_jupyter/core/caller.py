"""Who is calling the broker. Built by the server layer from a credential, never from request data."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

__all__ = ["CallerKind", "Caller"]


class CallerKind(StrEnum):
    KERNEL = "kernel"
    """A kernel started by this Jupyter server, identified by its own per-kernel credential (or a kernel that
    registered with the standalone daemon: the origin the daemon bound to the credential it issued)."""
    BROWSER = "browser"
    """An authenticated Jupyter browser session (the side panel); may act for origins its user owns."""
    DAEMON = "daemon"
    """A client of the standalone daemon (Unix socket peer or bearer token): origin ``daemon:<name>``."""


class Caller(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: CallerKind
    origin: str | None
    """The origin this caller acts as (``notebook:<path>#<kernel_id>``, ``daemon:<name>``); None for a browser."""
    client_id: str
    """Stable id of this connection/client; permission requests are routed to it (originator)."""
    user: str | None = None
    """Jupyter user name, for browser sessions."""
    stops_all: bool = False
    """May stop every run of its broker, or one named origin's (``kill``): the daemon's terminal client
    (``jupyter relay kill``). Stopping never widens anything; every client of one daemon is its one user."""
