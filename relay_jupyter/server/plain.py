"""The relay endpoints on a plain tornado ``Application`` with a pluggable "who is the caller" function.

The standalone daemon (``jupyter relay serve``) builds its app here: it passes a ``resolve_caller``
that checks its own credentials (Unix-socket peer, bearer token; :class:`.daemon_auth.DaemonGate`)
and returns a ``Caller`` or None. None is answered with one fixed 401 (same bytes for a missing,
malformed and wrong credential: no ``Date`` header, fixed headers and body). A resolver may also
answer the request itself (a 429 cooldown, a 400) by finishing it. Benchmarks use this app too,
so they measure the same handler code the Jupyter server runs.

    app = make_app(broker, resolve_caller)
    server = app.listen(0, "127.0.0.1")

Every path outside the five endpoints goes through the same resolver before its 404, so an
unknown path tells an unauthenticated client nothing. Log lines never contain a query string
(where a client might have put a token) and pass the path through ``scrub`` first.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from tornado import web

from ..broker.anthropic_proxy import anthropic_error_body
from ..broker.model_proxy import MAX_BODY_BYTES as MODEL_MAX_BODY_BYTES
from ..broker.model_proxy import openai_error_body
from ..broker.assembly import stop_components
from ..broker.mcp_gateway import GatewayHandler, mcp_gateway_of
from ..broker.broker import Broker
from ..core.caller import Caller
from .conn_guard import trust_connection
from .anthropic_endpoint import AnthropicEndpoint
from .openai_endpoint import OpenAIEndpoint
from .endpoints import EventsEndpoint, HealthEndpoint, MetricsEndpoint, ReadyEndpoint, RpcEndpoint

__all__ = ["UNAUTHORIZED_BODY", "UNAUTHORIZED_HEADERS", "Activity", "ResolveCaller", "make_app", "refuse"]

log = logging.getLogger("relay_jupyter.daemon")
access_log = logging.getLogger("relay_jupyter.daemon.access")

ResolveCaller = Callable[[web.RequestHandler], "Caller | None | Awaitable[Caller | None]"]

#: The one body of every 401.
UNAUTHORIZED_BODY = b'{"message": "authentication required: send Authorization: Bearer <daemon token>"}'
#: The headers of every 401 besides Content-Length.
UNAUTHORIZED_HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Type", "application/json"),
    ("WWW-Authenticate", 'Bearer realm="relay"'),
    ("Cache-Control", "no-store"),
)


class Activity(Protocol):
    """Told when a request starts and ends (the daemon's idle timer and token-rotation bookkeeping)."""

    def started(self, handler: web.RequestHandler) -> None: ...

    def ended(self, handler: web.RequestHandler) -> None: ...


def refuse(handler: web.RequestHandler, status: int, body: bytes,
           headers: tuple[tuple[str, str], ...] = UNAUTHORIZED_HEADERS) -> None:
    """Refuse the request with exactly ``status``, ``headers`` and ``body`` (see :func:`answer_exactly`).

    A relay handler may defer the answer until it has read a small request body, so that the
    connection stays usable (tornado closes a connection answered before its body was read).
    """
    defer = getattr(handler, "relay_refuse", None)
    if defer is not None:
        defer(status, body, headers)
    else:
        answer_exactly(handler, status, body, headers)


def answer_exactly(handler: web.RequestHandler, status: int, body: bytes,
                   headers: tuple[tuple[str, str], ...] = UNAUTHORIZED_HEADERS) -> None:
    """Answer with exactly ``status``, ``headers`` and ``body``: nothing that varies per request or second."""
    handler.clear()
    handler.clear_header("Date")
    handler.set_status(status)
    for name, value in headers:
        handler.set_header(name, value)
    handler.finish(body)


def _peer(handler: web.RequestHandler) -> str:
    """The client's address for a log line: its IP, or ``unix`` on a Unix socket (tornado says 0.0.0.0)."""
    stream = getattr(handler.request.connection, "stream", None)
    sock = getattr(stream, "socket", None)
    if sock is not None and sock.family == socket.AF_UNIX:
        return "unix"
    return handler.request.remote_ip or "?"


def _scrub(handler: web.RequestHandler) -> str:
    scrub = handler.settings.get("relay_scrub")
    path = handler.request.path
    return (scrub(path) if scrub is not None else path)[:200]


class _PlainAuth(web.RequestHandler):
    """``prepare`` authenticates with ``settings["relay_resolve_caller"]``; None -> the fixed 401."""

    relay_caller: Caller | None = None
    relay_endpoint = "unknown"
    """The endpoint's name (``rpc``, ``events``, ``healthz``, ...); resolvers read it."""
    relay_refused = False

    def relay_refuse(self, status: int, body: bytes, headers: tuple[tuple[str, str], ...]) -> None:
        """Refuse now (bodiless endpoints)."""
        self.relay_refused = True
        answer_exactly(self, status, body, headers)

    async def prepare(self) -> None:
        activity = self.settings.get("relay_activity")
        if activity is not None:
            activity.started(self)
        resolve = self.settings["relay_resolve_caller"]
        caller = resolve(self)
        if inspect.isawaitable(caller):
            caller = await caller
        if self.relay_refused:  # the resolver answered (cooldown, bad request)
            return
        if caller is None:
            refuse(self, 401, UNAUTHORIZED_BODY)
            return
        self.relay_caller = caller
        trust_connection(self.request)  # no longer counted as a possible Slowloris (server/conn_guard.py)

    def on_finish(self) -> None:
        activity = self.settings.get("relay_activity")
        if activity is not None:
            activity.ended(self)

    def on_connection_close(self) -> None:
        activity = self.settings.get("relay_activity")
        if activity is not None:
            activity.ended(self)
        super().on_connection_close()

    def _request_summary(self) -> str:
        # tornado's version includes the query string; ours never does
        return f"{self.request.method} {_scrub(self)} ({_peer(self)})"

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        # tornado's version logs repr(request), which carries the full URI
        if isinstance(value, web.HTTPError):
            if value.log_message:
                log.warning("%d %s: %s", value.status_code, self._request_summary(), value.log_message)
        else:
            log.error("Uncaught exception %s", self._request_summary(), exc_info=(typ, value, tb))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # never a traceback or an echo of the request: a status and a fixed message
        self.set_header("Content-Type", "application/json")
        self.finish(b'{"message": "%s"}' % (self._reason.encode("ascii", "replace")))


@web.stream_request_body
class PlainRpcHandler(_PlainAuth, RpcEndpoint):
    relay_endpoint = "rpc"
    _relay_refusal: tuple[int, bytes, tuple[tuple[str, str], ...]] | None = None

    def relay_refuse(self, status: int, body: bytes, headers: tuple[tuple[str, str], ...]) -> None:
        """Refuse after the (small, declared-length) body has been read and dropped, so the
        keep-alive connection stays usable; refuse at once when the body is large or chunked."""
        self.relay_refused = True
        length = self.request.headers.get("Content-Length", "")
        if (self.request.method == "POST" and length.isascii() and length.isdigit() and int(length) <= self.relay_broker.config.max_body_bytes
                and "Transfer-Encoding" not in self.request.headers):
            self._relay_refusal = (status, body, headers)
            return
        answer_exactly(self, status, body, headers)

    async def prepare(self) -> None:
        await super().prepare()
        if not self.relay_refused:
            self.relay_prepare_body()

    def data_received(self, chunk: bytes) -> None:
        if self.relay_refused:
            return  # never buffer an unauthenticated body
        super().data_received(chunk)

    async def post(self) -> None:
        if self._relay_refusal is not None:
            answer_exactly(self, *self._relay_refusal)
            return
        await self.relay_post()


class PlainEventsHandler(_PlainAuth, EventsEndpoint):
    relay_endpoint = "events"

    async def get(self) -> None:
        try:
            await self.relay_get()
        finally:
            # the stream may end without finish(): count it as ended either way
            self.on_finish()


class PlainHealthzHandler(_PlainAuth, HealthEndpoint):
    relay_endpoint = "healthz"

    def get(self) -> None:
        self.relay_get()


class PlainReadyzHandler(_PlainAuth, ReadyEndpoint):
    relay_endpoint = "readyz"

    def get(self) -> None:
        self.relay_get()


class PlainMetricsHandler(_PlainAuth, MetricsEndpoint):
    relay_endpoint = "metrics"

    def get(self) -> None:
        self.relay_get()


@web.stream_request_body
class PlainKernelHandler(_PlainAuth):
    """``POST {prefix}kernel``: a kernel obtains its daemon credential and origin (``settings["relay_kernels"]``,
    :class:`.daemon_auth.KernelRegistry`; 404 where there is none). Bodiless: the kernel's claim, if any, is
    the ``X-Relay-Notebook`` header; a body is never buffered."""

    relay_endpoint = "kernel"

    def data_received(self, chunk: bytes) -> None:
        return None  # nothing to read: never buffer a body here

    async def post(self) -> None:
        if self.relay_refused or self._finished:
            return
        kernels = self.settings.get("relay_kernels")
        if kernels is None:
            raise web.HTTPError(404)
        answer = kernels.register(self)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(answer))


class PlainNotFoundHandler(_PlainAuth):
    """Any other path: authenticated like the endpoints, then 404."""

    async def prepare(self) -> None:
        await super().prepare()
        if not self.relay_refused:
            raise web.HTTPError(404)


class _EarlyBody:
    """The body of a daemon endpoint read only once its caller is known (``@web.stream_request_body`` on the
    concrete class; red team, tests/attack/test_preauth_body.py): tornado buffers a plain handler's whole body
    (up to 100 MB) before ``prepare`` runs, so a client without the token could make the daemon hold 100 MB
    per connection. An unauthenticated body is never buffered (a small declared one is read and dropped so
    the connection stays usable, as the RPC endpoint does); an authenticated one is capped at
    ``relay_body_limit`` while it arrives (413)."""

    relay_body_limit = 1 << 20
    _relay_chunks: list[bytes] | None = None
    _relay_size = 0
    _relay_deferred: tuple[int, bytes, tuple[tuple[str, str], ...]] | None = None

    def relay_refuse(self, status: int, body: bytes, headers: tuple[tuple[str, str], ...]) -> None:
        self.relay_refused = True  # type: ignore[attr-defined]
        request = self.request  # type: ignore[attr-defined]
        length = request.headers.get("Content-Length", "")
        if (request.method == "POST" and length.isascii() and length.isdigit()
                and int(length) <= self.relay_broker_body_bytes() and "Transfer-Encoding" not in request.headers):
            self._relay_deferred = (status, body, headers)
            return
        answer_exactly(self, status, body, headers)  # type: ignore[arg-type]

    def relay_broker_body_bytes(self) -> int:
        return int(self.settings["relay_broker"].config.max_body_bytes)  # type: ignore[attr-defined]

    def relay_accept_body(self) -> None:
        """Call at the end of ``prepare`` once the caller is known: buffer from now on."""
        if not self._finished and not getattr(self, "relay_refused", False):  # type: ignore[attr-defined]
            self._relay_chunks = []

    def relay_accept_oversized(self) -> None:
        """An authenticated caller declared a body over ``relay_body_limit``: read it and drop every chunk
        (nothing is kept), then answer 413 from the verb. Answering before it arrived would close the
        connection under a client still sending, which SDKs report as a connection error, not the 413;
        tornado's own cap (4x the limit) still closes a connection that sends more."""
        self._relay_oversized = True
        connection = getattr(self.request, "connection", None)  # type: ignore[attr-defined]
        if connection is not None and hasattr(connection, "set_max_body_size"):
            connection.set_max_body_size(self.relay_body_limit * 4)

    _relay_oversized = False

    def data_received(self, chunk: bytes) -> None:
        if self._relay_oversized or self._relay_chunks is None or self._finished:  # type: ignore[attr-defined]
            return  # never buffer an unauthenticated (or an oversized) body
        self._relay_size += len(chunk)
        if self._relay_size > self.relay_body_limit:
            self._relay_chunks = None
            self.relay_too_large()
            return
        self._relay_chunks.append(chunk)

    def relay_too_large(self) -> None:
        answer_exactly(self, 413, b'{"message": "the request body is too large"}',  # type: ignore[arg-type]
                       (("Content-Type", "application/json"),))

    def relay_body_ready(self) -> bool:
        """Call first in the verb: answers a deferred refusal (False), else puts the body in ``request.body``."""
        if self._relay_deferred is not None:
            answer_exactly(self, *self._relay_deferred)  # type: ignore[arg-type]
            return False
        if self._relay_oversized and not self._finished:  # type: ignore[attr-defined]
            self.relay_too_large()
            return False
        if self._finished or self._relay_chunks is None:  # type: ignore[attr-defined]
            return False
        self.request.body = b"".join(self._relay_chunks)  # type: ignore[attr-defined]
        self._relay_chunks = []
        return True


class _PlainModelKey(_EarlyBody):
    """What the daemon's two model endpoints share: the daemon token may come as the SDK's API key
    (``x-api-key``, or ``Authorization: Bearer``), and a refusal is the endpoint's own 401 shape (the same
    bytes for a missing and a wrong token). Placed before the endpoint class in the bases."""

    relay_error_body: Any  # staticmethod(anthropic_error_body | openai_error_body)

    def relay_refuse(self, status: int, body: bytes, headers: tuple[tuple[str, str], ...]) -> None:
        if status == 401:
            body = self.relay_error_body("authentication_error", "send the relay daemon token as the API key")
        super().relay_refuse(status, body, headers)  # type: ignore[misc]

    async def prepare(self) -> None:
        request = self.request  # type: ignore[attr-defined]
        key = request.headers.get("x-api-key", "").strip()
        if key and "Authorization" not in request.headers:
            request.headers["Authorization"] = f"Bearer {key}"
        await super().prepare()  # type: ignore[misc]
        if not self.relay_refused:  # type: ignore[attr-defined]
            length = request.headers.get("Content-Length", "")
            if length.isascii() and length.isdigit() and int(length) > self.relay_body_limit:
                self.relay_accept_oversized()
            elif self.check_body_size():  # type: ignore[attr-defined]
                self.relay_accept_body()

    def relay_too_large(self) -> None:
        self._refuse_early(413, "request_too_large",  # type: ignore[attr-defined]
                           f"the request body is over {self.relay_body_limit} bytes")


class _PlainAnthropic(_PlainModelKey, AnthropicEndpoint, _PlainAuth):
    """The Anthropic-compatible endpoint on the daemon (the key is what the SDKs and the ``claude`` CLI send)."""

    relay_endpoint = "anthropic"
    relay_error_body = staticmethod(anthropic_error_body)
    relay_body_limit = MODEL_MAX_BODY_BYTES

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        AnthropicEndpoint.write_error(self, status_code, **kwargs)


@web.stream_request_body
class PlainAnthropicMessagesHandler(_PlainAnthropic):
    async def post(self) -> None:
        if self.relay_body_ready():
            await self.relay_messages()


@web.stream_request_body
class PlainAnthropicCountTokensHandler(_PlainAnthropic):
    async def post(self) -> None:
        if self.relay_body_ready():
            await self.relay_messages(count_tokens=True)


class PlainAnthropicModelsHandler(_PlainAnthropic):
    async def get(self) -> None:
        await self.relay_models()


class _PlainOpenAI(_PlainModelKey, OpenAIEndpoint, _PlainAuth):
    """The OpenAI-compatible endpoint on the daemon (``Authorization: Bearer``, what the ``openai`` SDK sends)."""

    relay_endpoint = "openai"
    relay_error_body = staticmethod(openai_error_body)
    relay_body_limit = MODEL_MAX_BODY_BYTES

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        OpenAIEndpoint.write_error(self, status_code, **kwargs)


@web.stream_request_body
class PlainOpenAIChatCompletionsHandler(_PlainOpenAI):
    async def post(self) -> None:
        if self.relay_body_ready():
            await self.relay_chat_completions()


class PlainOpenAIModelsHandler(_PlainOpenAI):
    async def get(self) -> None:
        await self.relay_models()


@web.stream_request_body
class PlainGatewayHandler(_EarlyBody, GatewayHandler):
    """``{prefix}mcp``: the gated MCP gateway (broker/mcp_gateway.py, docs/mcp.md) on the daemon. Not behind
    ``resolve_caller``: like ``{base_url}relay/mcp`` in the Jupyter server it opens with a gateway token only
    (``jupyter relay mcp-token``), never with the daemon token; its own 401, 400 (token in the URL), 403
    (foreign ``Origin``). Told to ``activity`` like the other endpoints (a client calling tools keeps the
    daemon from idling out). No side panel here: a ``--notebook`` token (no originator) is refused with one line
    (``panel_answers``) instead of having every write time out."""

    panel_answers = False

    def initialize(self, **_: Any) -> None:
        self.gateway = mcp_gateway_of(self.settings["relay_broker"])

    def prepare(self) -> None:
        activity = self.settings.get("relay_activity")
        if activity is not None:
            activity.started(self)
        if self.request.method != "POST":
            return
        # the body is buffered only for a gateway token (_EarlyBody); without one a small declared body is
        # read and dropped and post() gives the usual 400/403/401, anything else is refused now, unread
        scheme, _, value = self.request.headers.get("Authorization", "").partition(" ")
        if self.gateway.authenticate(value.strip() if scheme.lower() == "bearer" else "") is not None:
            trust_connection(self.request)
            self.relay_accept_body()
            return
        length = self.request.headers.get("Content-Length", "")
        if not (length.isascii() and length.isdigit() and int(length) <= self.relay_body_limit
                and "Transfer-Encoding" not in self.request.headers):
            self._session()

    def relay_too_large(self) -> None:
        self._refuse(413, b'{"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": '
                          b'"the body is over %d bytes"}}' % self.relay_body_limit)

    async def post(self) -> None:
        if self._finished:  # refused while the body arrived (413)
            return
        if self._relay_chunks is None:
            self.request.body = b""  # an unauthenticated body was dropped: _session() refuses it
        elif not self.relay_body_ready():
            return
        await super().post()

    def on_finish(self) -> None:
        activity = self.settings.get("relay_activity")
        if activity is not None:
            activity.ended(self)

    def on_connection_close(self) -> None:  # a client gone while its write waited for consent
        self.on_finish()
        super().on_connection_close()


def _log_request(handler: web.RequestHandler) -> None:
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    access_log.log(level, "%d %s %s (%s) %.1fms", status, handler.request.method, _scrub(handler),
                   _peer(handler), 1000.0 * handler.request.request_time())


def make_app(broker: Broker, resolve_caller: ResolveCaller, *, prefix: str = "/relay/",
             activity: Activity | None = None, scrub: Callable[[str], str] | None = None,
             **settings: Any) -> web.Application:
    """A tornado Application serving ``rpc``, ``events``, ``healthz``, ``readyz``, ``metrics`` and the
    Anthropic-compatible ``anthropic/v1/...`` (``server/anthropic_endpoint.py``) and the OpenAI-compatible
    ``openai/v1/...`` (``server/openai_endpoint.py``) and the gated MCP gateway ``mcp`` (gateway tokens
    only, not ``resolve_caller``: ``broker/mcp_gateway.py``) under ``prefix``.

    Args:
        broker: the broker the endpoints call.
        resolve_caller: ``handler -> Caller | None`` (may be async, may finish the request itself).
        prefix: URL prefix of the endpoints.
        activity: told when each request starts and ends.
        scrub: ``path -> path`` applied before a path is logged (masks a token a client put there).
    """
    routes = [
        (prefix + "rpc", PlainRpcHandler),
        (prefix + "events", PlainEventsHandler),
        (prefix + "healthz", PlainHealthzHandler),
        (prefix + "readyz", PlainReadyzHandler),
        (prefix + "metrics", PlainMetricsHandler),
        (prefix + "kernel", PlainKernelHandler),
        (prefix + "anthropic/v1/messages", PlainAnthropicMessagesHandler),
        (prefix + "anthropic/v1/messages/count_tokens", PlainAnthropicCountTokensHandler),
        (prefix + "anthropic/v1/models", PlainAnthropicModelsHandler),
        (prefix + "openai/v1/chat/completions", PlainOpenAIChatCompletionsHandler),
        (prefix + "openai/v1/models", PlainOpenAIModelsHandler),
        (prefix + "mcp", PlainGatewayHandler),
        (r"/.*", PlainNotFoundHandler),
    ]
    settings.setdefault("log_function", _log_request)
    return web.Application(routes, relay_broker=broker, relay_resolve_caller=resolve_caller,
                           relay_activity=activity, relay_scrub=scrub, **settings)


async def shut_down(server: Any, broker: Broker | None, *, grace: float) -> None:
    """The end of a standalone broker process (the daemon, the hub service): stop listening, give open
    connections ``grace`` seconds, stop runs and MCP servers, close the store."""
    if server is not None:
        server.stop()
        try:
            async with asyncio.timeout(grace):
                await server.close_all_connections()
        except TimeoutError:
            log.warning("some connections did not close within %.0f s", grace)
    if broker is not None:
        try:
            await stop_components(broker)
        except Exception:  # shutting down: a failing MCP server must not keep the store open
            log.warning("stopping runs and MCP servers failed", exc_info=True)
        broker.close()
