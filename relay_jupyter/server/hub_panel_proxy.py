"""The side panel on a hub: a thin server passes ``{base_url}relay/rpc`` and ``{base_url}relay/events`` on to the
hub service (issue 15 items 3 and 4), so the panel's TypeScript works unchanged.

The browser authenticates to the user's own server as Jupyter does (cookie + XSRF, or a token; ``@web.authenticated``
and ``@authorized`` on resource ``relay``); the server calls the service with the user's hub token
(``$JUPYTERHUB_API_TOKEN``, never logged, never sent to the browser) and ``X-Relay-Panel: 1``. The service makes
that a caller of kind ``panel`` acting for the origins ``user:<name>/…`` of the token's user and only those
(core/caller.py ``Caller.acts_for``): what the panel lists, answers and streams is decided there, not here.

Written by hand over tornado's HTTP client (already a dependency): a generic reverse proxy library would add a
dependency for two routes, and the one thing to get right, streaming SSE through without buffering, is a
``streaming_callback``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .handlers import AUTH_RESOURCE
from .hub_service import PANEL_HEADER

__all__ = ["panel_proxy_handlers"]

log = logging.getLogger("relay_jupyter.hub")

_CLIENT_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_RPC_TIMEOUT = 120.0
#: an event stream lives as long as the browser keeps it open; the service's heartbeats keep it moving
_STREAM_MAX_BYTES = 1 << 62
#: chunks written to the browser and not yet flushed: past this the browser is not reading and the stream is closed
#: (it reconnects with ``since``, as after the service drops a slow subscriber); the proxy never buffers without end
_MAX_UNFLUSHED = 256


class _PanelProxy(APIHandler):
    auth_resource = AUTH_RESOURCE

    def initialize(self, service_url: str, token: Callable[[], str | None]) -> None:  # type: ignore[override]
        self.service_url = service_url
        self.hub_token = token
        self._closed = False

    def finish(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        kwargs.setdefault("set_content_type", self._headers.get("Content-Type", "application/json"))
        return super().finish(*args, **kwargs)

    def on_connection_close(self) -> None:
        self._closed = True
        super().on_connection_close()

    def upstream_headers(self) -> dict[str, str] | None:
        """The headers for the service, or None after answering the browser with an error."""
        token = self.hub_token()
        if not token:
            self._fail(503, "this server has no JupyterHub token (JUPYTERHUB_API_TOKEN) to reach the relay service")
            return None
        client = self.request.headers.get("X-Relay-Client", "default")
        if not _CLIENT_NAME.match(client):
            self._fail(400, "X-Relay-Client must be 1-64 of [A-Za-z0-9_.:-]")
            return None
        return {"Authorization": f"token {token}", PANEL_HEADER: "1", "X-Relay-Client": client}

    def _fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))


class PanelRpcProxy(_PanelProxy):
    """``POST relay/rpc`` -> the service's ``relay/rpc``, body and answer as they are."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        headers = self.upstream_headers()
        if headers is None:
            return
        headers["Content-Type"] = "application/json"
        try:
            response = await AsyncHTTPClient().fetch(HTTPRequest(
                self.service_url + "relay/rpc", method="POST", body=self.request.body, headers=headers,
                request_timeout=_RPC_TIMEOUT, follow_redirects=False), raise_error=False)
        except OSError as exc:  # the service is down: one line, never a traceback
            log.warning("relay: the hub service did not answer the side panel: %s", type(exc).__name__)
            self._fail(502, "the relay hub service is not reachable; retry")
            return
        if response.code == 599:
            self._fail(502, "the relay hub service is not reachable; retry")
            return
        self.set_status(response.code)
        self.set_header("Content-Type", response.headers.get("Content-Type", "application/json"))
        self.set_header("Cache-Control", "no-store")
        self.finish(response.body or b"")


class PanelEventsProxy(_PanelProxy):
    """``GET relay/events`` -> the service's ``relay/events``: the SSE stream passed through as it comes."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        headers = self.upstream_headers()
        if headers is None:
            return
        last = self.request.headers.get("Last-Event-ID")
        if last is not None:
            headers["Last-Event-ID"] = last
        since = self.get_query_argument("since", None)
        url = self.service_url + "relay/events"
        if since is not None:
            from urllib.parse import quote

            url += "?since=" + quote(since, safe="")
        status: list[int] = []
        started = False
        unflushed = 0

        def flushed(done: Any) -> None:
            nonlocal unflushed
            unflushed -= 1
            if not done.cancelled():
                done.exception()  # a browser gone mid-write: seen here, not logged as never retrieved

        def on_header(line: str) -> None:
            if not status and line.startswith("HTTP/"):
                parts = line.split(" ", 2)
                if len(parts) >= 2 and parts[1].isdigit():
                    status.append(int(parts[1]))

        refused: list[bytes] = []

        def on_chunk(chunk: bytes) -> None:
            nonlocal started, unflushed
            if self._closed:
                raise _BrowserGone  # ends the service's stream (and its subscription) with the browser's
            if status and status[0] != 200:  # not a stream (a bad `since`, a refused token): its one JSON answer
                if sum(map(len, refused)) < 65536:
                    refused.append(chunk)
                return
            if not started:
                started = True
                self.set_header("Content-Type", "text/event-stream; charset=utf-8")
                self.set_header("Cache-Control", "no-cache, no-store")
                self.set_header("X-Accel-Buffering", "no")
            if unflushed >= _MAX_UNFLUSHED:  # a browser that does not read: end its stream, free the memory
                self._closed = True
                if self.request.connection is not None and self.request.connection.stream is not None:
                    self.request.connection.stream.close()
                raise _BrowserGone
            self.write(chunk)
            unflushed += 1
            self.flush().add_done_callback(flushed)

        client = AsyncHTTPClient(force_instance=True, max_body_size=_STREAM_MAX_BYTES)
        try:
            response = await client.fetch(HTTPRequest(
                url, method="GET", headers=headers, request_timeout=0, connect_timeout=20,
                streaming_callback=on_chunk, header_callback=on_header, follow_redirects=False), raise_error=False)
        except (_BrowserGone, OSError, HTTPClientError):
            response = None
        finally:
            client.close()
        if self._closed:
            self._finished = True  # nothing more can be written to a gone browser
            return
        if started:
            self.finish()
            return
        if refused and status:
            self.set_status(status[0])
            self.set_header("Content-Type", "application/json")
            self.finish(b"".join(refused))
            return
        if response is None or response.code == 599:
            self._fail(502, "the relay hub service is not reachable; retry")
            return
        # an answer that is not a stream (a bad `since`, a refused token): its status and JSON body
        self.set_status(response.code)
        self.set_header("Content-Type", response.headers.get("Content-Type", "application/json"))
        self.finish(response.body or b"")


class _BrowserGone(Exception):
    pass


def panel_proxy_handlers(service_url: str, token: Callable[[], str | None]) -> list[tuple[str, type, dict]]:
    """``(pattern, handler, kwargs)`` for ``relay/rpc`` and ``relay/events`` (the extension prefixes base_url)."""
    kwargs = {"service_url": service_url, "token": token}
    return [(r"/relay/rpc", PanelRpcProxy, kwargs), (r"/relay/events", PanelEventsProxy, kwargs)]
