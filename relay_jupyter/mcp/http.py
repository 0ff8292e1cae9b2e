"""Streamable HTTP for MCP servers, with the endpoint policy and a response-size cap.

``streamable_http_client`` from the MCP SDK does the protocol; this module builds the
``httpx2.AsyncClient`` it is given:

- configured headers (tokens) on every request; header values never logged;
- the endpoint policy re-checked on every request (a redirect or a bug cannot send a token
  to a non-loopback plain-http host);
- every POST response body capped at ``max_message_bytes`` (the SDK caps SSE events but
  reads a JSON body whole): over the cap the transport marks itself ``flooded`` and the
  read fails, so the call fails with a clear error instead of exhausting memory;
- no proxies from the environment for loopback URLs (a token must not leave the machine
  through an ``HTTP_PROXY`` when the server is on 127.0.0.1);
- a 401 / 403 answer is remembered (``auth_status``, and whether the server offers OAuth:
  ``auth_offers_oauth``): the SDK turns it into a generic error, and the user must read "needs
  authorisation", not "could not be reached".
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
from mcp.client.streamable_http import streamable_http_client

from ..core.errors import ConfigRefusal
from .config import HttpServerConfig
from .policy import check_endpoint, is_loopback_host

__all__ = ["HttpTransport"]


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, cap: int, owner: HttpTransport) -> None:
        self._inner, self._cap, self._owner, self._seen = inner, cap, owner, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._inner:
            self._seen += len(part)
            if self._seen > self._cap:
                self._owner.flooded = True
                raise httpx2.ReadError(f"MCP response larger than {self._cap} bytes")
            yield part

    async def aclose(self) -> None:
        await self._inner.aclose()


class _PolicyTransport(httpx2.AsyncBaseTransport):
    """Wraps the default transport: endpoint policy per request, body cap per POST response."""

    def __init__(self, owner: HttpTransport, *, trust_env: bool) -> None:
        self._owner = owner
        self._inner = httpx2.AsyncHTTPTransport(trust_env=trust_env)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            check_endpoint(str(request.url))
        except ConfigRefusal as exc:
            raise httpx2.UnsupportedProtocol(exc.message) from None
        response = await self._inner.handle_async_request(request)
        if 200 <= response.status_code < 300:
            self._owner.auth_status = None  # an OAuth flow that retried after the 401 got through
        elif response.status_code in (401, 403):
            self._owner.auth_status = response.status_code
            challenge = response.headers.get("www-authenticate", "").lower()
            # MCP authorization: a server that does OAuth names its protected-resource metadata here
            self._owner.auth_offers_oauth = "resource_metadata" in challenge
        if request.method == "POST":
            # The GET stream is long-lived (bounded per event by the SDK); a POST answers one message.
            response.stream = _CappedStream(response.stream, self._owner.max_message_bytes, self._owner)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class HttpTransport:
    """Async context manager yielding ``(read_stream, write_stream)`` for ``mcp.Client``."""

    def __init__(self, config: HttpServerConfig, *, max_message_bytes: int, connect_timeout: float = 30.0,
                 auth: httpx2.Auth | None = None) -> None:
        self.config = config
        self.max_message_bytes = max_message_bytes
        self.flooded = False
        self.auth_status: int | None = None
        """401 or 403 when the server refused the credentials (or their absence); never the header values."""
        self.auth_offers_oauth = False
        host = httpx2.URL(config.url).host
        self._client = httpx2.AsyncClient(
            headers=dict(config.headers),
            transport=_PolicyTransport(self, trust_env=not is_loopback_host(host)),
            timeout=httpx2.Timeout(connect_timeout, read=300.0),
            follow_redirects=False,
            auth=auth,  # OAuth (mcp/oauth.py): the SDK's provider, its requests through the same policy
        )
        self._cm = streamable_http_client(
            config.url, http_client=self._client, max_sse_event_size=max_message_bytes
        )

    async def __aenter__(self):
        await self._client.__aenter__()
        try:
            return await self._cm.__aenter__()
        except BaseException:
            await self._client.aclose()
            raise

    async def __aexit__(self, exc_type, exc, tb) -> bool | None:
        try:
            return await self._cm.__aexit__(exc_type, exc, tb)
        finally:
            await self._client.aclose()
