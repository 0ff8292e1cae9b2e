"""Who is calling the broker. Built by the server layer from a credential, never from request data."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["CallerKind", "Caller"]


class CallerKind(StrEnum):
    KERNEL = "kernel"
    """A kernel started by this Jupyter server, identified by its own per-kernel credential (or a kernel that
    registered with the standalone daemon: the origin the daemon bound to the credential it issued)."""
    BROWSER = "browser"
    """An authenticated Jupyter browser session (the side panel); may act for origins its user owns."""
    DAEMON = "daemon"
    """A client of the standalone daemon (Unix socket peer or bearer token): origin ``daemon:<name>``."""
    PANEL = "panel"
    """A hub user's side panel (through the user's own server, with the user's hub token): acts for the
    origins under its :attr:`Caller.origin_prefix` (``user:<name>/``) and only those (docs/multi-user.md)."""


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
    origin_prefix: str | None = None
    """:attr:`CallerKind.PANEL` only: the prefix of every origin it acts for (``user:<name>/``, ends with ``/``)."""

    @model_validator(mode="after")
    def _panel_has_a_prefix(self) -> Caller:
        if self.kind is CallerKind.PANEL:
            p = self.origin_prefix
            if not p or not p.endswith("/") or p.count("/") != 1 or self.origin is not None or self.stops_all:
                raise ValueError("a panel caller acts for one origin prefix 'user:<name>/' and has no origin")
        elif self.origin_prefix is not None:
            raise ValueError("only a panel caller has an origin prefix")
        return self

    def acts_for(self, origin: str | None) -> bool:
        """The one rule of whose objects a caller may see and act on: a browser session of a Jupyter server every
        origin of its server; a hub user's panel the origins under its prefix; any other caller its own origin."""
        if self.kind is CallerKind.BROWSER:
            return True
        if origin is None:
            return False
        if self.kind is CallerKind.PANEL:
            return self.origin_prefix is not None and origin.startswith(self.origin_prefix)
        return self.origin is not None and origin == self.origin

    @property
    def sees_many(self) -> bool:
        """True for a caller that acts for more than one origin (a browser session, a hub user's panel)."""
        return self.kind in (CallerKind.BROWSER, CallerKind.PANEL)
