"""The relay endpoints on a plain tornado ``Application`` with a pluggable "who is the caller" function.

The standalone daemon (``jupyter relay serve``) builds its app here: it passes a ``resolve_caller``
that checks its own credentials (Unix-socket peer, bearer token) and returns a ``Caller`` or None.
None is answered with one fixed 401 (same bytes for a missing and a wrong credential). Benchmarks
use it too, so they measure the same handler code the Jupyter server runs.

    app = make_app(broker, resolve_caller)
    server = app.listen(0, "127.0.0.1")
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from tornado import web

from ..broker.broker import Broker
from ..core.caller import Caller
from .endpoints import EventsEndpoint, HealthEndpoint, MetricsEndpoint, ReadyEndpoint, RpcEndpoint

__all__ = ["make_app", "ResolveCaller", "UNAUTHORIZED_BODY"]

ResolveCaller = Callable[[web.RequestHandler], "Caller | None | Awaitable[Caller | None]"]
UNAUTHORIZED_BODY = b'{"message": "unauthorized"}'


class _PlainAuth(web.RequestHandler):
    """``prepare`` authenticates with ``settings["relay_resolve_caller"]``; None -> the fixed 401."""

    relay_caller: Caller | None = None

    async def prepare(self) -> None:
        resolve = self.settings["relay_resolve_caller"]
        caller = resolve(self)
        if inspect.isawaitable(caller):
            caller = await caller
        if caller is None:
            self.set_status(401)
            self.set_header("Content-Type", "application/json")
            self.set_header("WWW-Authenticate", "Bearer")
            self.finish(UNAUTHORIZED_BODY)
            return
        self.relay_caller = caller

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # never a traceback or an echo of the request: a status and a fixed message
        self.set_header("Content-Type", "application/json")
        self.finish(b'{"message": "%s"}' % (self._reason.encode("ascii", "replace")))


@web.stream_request_body
class PlainRpcHandler(_PlainAuth, RpcEndpoint):
    async def prepare(self) -> None:
        await super().prepare()
        if not self._finished:
            self.relay_prepare_body()

    async def post(self) -> None:
        await self.relay_post()


class PlainEventsHandler(_PlainAuth, EventsEndpoint):
    async def get(self) -> None:
        await self.relay_get()


class PlainHealthzHandler(_PlainAuth, HealthEndpoint):
    def get(self) -> None:
        self.relay_get()


class PlainReadyzHandler(_PlainAuth, ReadyEndpoint):
    def get(self) -> None:
        self.relay_get()


class PlainMetricsHandler(_PlainAuth, MetricsEndpoint):
    def get(self) -> None:
        self.relay_get()


def make_app(broker: Broker, resolve_caller: ResolveCaller, *, prefix: str = "/relay/",
             **settings: Any) -> web.Application:
    """A tornado Application serving ``rpc``, ``events``, ``healthz``, ``readyz``, ``metrics`` under ``prefix``."""
    routes = [
        (prefix + "rpc", PlainRpcHandler),
        (prefix + "events", PlainEventsHandler),
        (prefix + "healthz", PlainHealthzHandler),
        (prefix + "readyz", PlainReadyzHandler),
        (prefix + "metrics", PlainMetricsHandler),
    ]
    return web.Application(routes, relay_broker=broker, relay_resolve_caller=resolve_caller, **settings)
