"""A cap on the daemon's TCP connections that have not shown who they are (Slowloris).

Tornado waits up to an hour for a request's headers and without limit for a body, and it accepts every
connection: a client without the token that opens hundreds of connections and sends a byte now and then holds
a file descriptor each, until the daemon hits its descriptor limit, stops accepting (tornado's accept handler
then spins on ``EMFILE``) and its own clients' calls go unanswered. Nothing is buffered for them
(``server/plain._EarlyBody``); it is the descriptors that run out.

:class:`GuardedHTTPServer` counts the connections that have not yet authenticated (in the order they were
accepted); when a new one arrives and the count is at the cap, the oldest one is closed. A handler calls
:func:`trust_connection` once a request on the connection has authenticated: from then on the connection is
never counted nor closed by the guard (a kernel's keep-alive connection, an SSE stream). An attacker must then
open more new connections than the cap in the instant between a client's connect and its headers to get in
the client's way — a flood, not a trickle. The cap is far below the usual soft limit of 1024 descriptors.

Written here: tornado offers no connection limit, and a reverse proxy in front is not the default deployment.
(red team, tests/attack/test_slowloris.py)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.iostream import IOStream

__all__ = ["GuardedHTTPServer", "trust_connection", "MAX_UNAUTHENTICATED"]

#: Connections that have not authenticated, at most, at once.
MAX_UNAUTHENTICATED = 128
_TRUSTED = "_relay_trusted"


def trust_connection(request: Any) -> None:
    """Mark the connection of ``request`` (a tornado ``HTTPServerRequest``) as authenticated."""
    stream = getattr(getattr(request, "connection", None), "stream", None)
    if stream is not None:
        setattr(stream, _TRUSTED, True)


class GuardedHTTPServer(HTTPServer):
    """An ``HTTPServer`` that keeps at most :data:`MAX_UNAUTHENTICATED` unauthenticated connections open."""

    relay_max_unauthenticated = MAX_UNAUTHENTICATED
    relay_evicted = 0

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        pending: OrderedDict[IOStream, None] = self.__dict__.setdefault("_relay_pending", OrderedDict())
        for old in [s for s in pending if s.closed() or getattr(s, _TRUSTED, False)]:
            del pending[old]
        while len(pending) >= self.relay_max_unauthenticated:
            oldest, _ = pending.popitem(last=False)
            oldest.close()
            self.relay_evicted += 1
        pending[stream] = None
        super().handle_stream(stream, address)
