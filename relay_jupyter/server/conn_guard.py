"""A cap on the daemon's TCP connections that have not shown who they are (Slowloris).

Tornado waits up to an hour for a request's headers and without limit for a body, and it accepts every
connection: a client without the token that opens hundreds of connections and sends a byte now and then holds
a file descriptor each, until the daemon hits its descriptor limit, stops accepting (tornado's accept handler
then spins on ``EMFILE``) and its own clients' calls go unanswered. Nothing is buffered for them
(``server/plain._EarlyBody``); it is the descriptors that run out.

:class:`GuardedHTTPServer` counts the connections that have not yet authenticated (in the order they were
accepted). When a new one arrives and :data:`MAX_UNAUTHENTICATED` are open, the oldest is closed if it has had
:data:`GRACE_SECONDS` to show who it is; younger ones are kept up to :data:`HARD_MAX_UNAUTHENTICATED`, beyond
which the oldest is closed whatever its age. (Tornado accepts up to 128 connections per wake-up before it reads
any of them, so a client's fresh connection in such a burst must not be closed for the attacker's next ones.)
A handler calls :func:`trust_connection` once a request on the connection has authenticated: from then on the
connection is never counted nor closed by the guard (a kernel's keep-alive connection, an SSE stream). Both
caps are far below the usual soft limit of 1024 descriptors.

Written here: tornado offers no connection limit, and a reverse proxy in front is not the default deployment.
(red team, tests/attack/test_slowloris.py)
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.iostream import IOStream

__all__ = ["GuardedHTTPServer", "trust_connection", "MAX_UNAUTHENTICATED", "HARD_MAX_UNAUTHENTICATED", "GRACE_SECONDS"]

#: Unauthenticated connections kept before the oldest (once past its grace) is closed for a new one.
MAX_UNAUTHENTICATED = 96
#: Unauthenticated connections at most, whatever their age.
HARD_MAX_UNAUTHENTICATED = 192
#: How long a new connection has to send an authenticated request before it may be closed for a newer one.
GRACE_SECONDS = 1.0
_TRUSTED = "_relay_trusted"


def trust_connection(request: Any) -> None:
    """Mark the connection of ``request`` (a tornado ``HTTPServerRequest``) as authenticated."""
    stream = getattr(getattr(request, "connection", None), "stream", None)
    if stream is not None:
        setattr(stream, _TRUSTED, True)


class GuardedHTTPServer(HTTPServer):
    """An ``HTTPServer`` that keeps at most :data:`MAX_UNAUTHENTICATED` unauthenticated connections open."""

    relay_max_unauthenticated = MAX_UNAUTHENTICATED
    relay_hard_max_unauthenticated = HARD_MAX_UNAUTHENTICATED
    relay_grace_seconds = GRACE_SECONDS
    relay_evicted = 0

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        pending: OrderedDict[IOStream, float] = self.__dict__.setdefault("_relay_pending", OrderedDict())
        for old in [s for s in pending if s.closed() or getattr(s, _TRUSTED, False)]:
            del pending[old]
        now = time.monotonic()
        while pending and (len(pending) >= self.relay_hard_max_unauthenticated or (
                len(pending) >= self.relay_max_unauthenticated
                and now - next(iter(pending.values())) >= self.relay_grace_seconds)):
            oldest, _ = pending.popitem(last=False)
            oldest.close()
            self.relay_evicted += 1
        pending[stream] = now
        super().handle_stream(stream, address)
