"""An ``httpx2`` client that bounds what a model server can make the broker buffer.

Both SSE readers buffer until a boundary: the Anthropic SDK's decoder until a blank line (one
event), ``httpx2``'s ``aiter_lines`` until a newline. A server that sends 64 MB with no newline
made either hold it all (and the OpenAI backend checked the size only after the whole line had
arrived). :func:`capped_client` counts the bytes of the current SSE event *as they arrive* and
raises :class:`StreamTooLarge` as soon as one passes the cap, so the memory a misbehaving server
costs is bounded by the cap plus one network read, whatever it sends.

It also asks for an uncompressed body (``accept-encoding: identity``) and refuses a compressed
event stream: the cap counts wire bytes, and a compressed flood would pass it. Redirects are not
followed by the clients that use it (a redirect could carry the API key to another host).

Hand-written because neither the SDK nor ``httpx2`` offers a bound on one SSE event or line.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx2

from ..core.netaddr import is_loopback_host

__all__ = ["POOL_LIMITS", "StreamCompressed", "StreamTooLarge", "capped_client"]

#: The connection pool of a model backend's one client (shared by every run of that backend): the official
#: SDKs' own default (``anthropic.DEFAULT_CONNECTION_LIMITS``). httpx's default keeps only 20 idle
#: connections, so after 64 concurrent runs 44 were closed and the next burst paid 44 new connections
#: (issue 18, measured in benchmarks/README.md run H).
POOL_LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)


class StreamTooLarge(Exception):
    """One SSE event (or line) from the model server is larger than the cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a stream event from the model server is larger than {limit} bytes")
        self.limit = limit


class StreamCompressed(Exception):
    """The model server compressed its event stream although we asked for identity."""


_BLANK_LINE = re.compile(rb"\r\n\r\n|\n\r\n|\n\n|\r\r")  # the end of an SSE event, any line ending


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = 0  # bytes of the current (unfinished) event so far
        tail = b""  # the last bytes already counted, so a blank line split across reads is found
        for_limit = self._limit
        async for chunk in self._inner:
            if not chunk:
                continue
            window = tail + chunk
            base = pending - len(tail)  # event bytes before window[0]
            for m in _BLANK_LINE.finditer(window):
                if base + m.start() > for_limit:  # an event that ended inside this read, still too big
                    raise StreamTooLarge(for_limit)
                base = -m.end()
            pending = base + len(window)
            if pending > for_limit + 3:  # (+3: the start of a blank line may be counted already)
                raise StreamTooLarge(for_limit)
            tail = window[-3:]
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _cap_hook(limit: int):
    async def hook(response: httpx2.Response) -> None:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity") and "event-stream" in response.headers.get("content-type", ""):
            await response.aclose()
            raise StreamCompressed(encoding)
        response.stream = _CappedStream(response.stream, limit)
    return hook


def capped_client(limit: int, *, timeout: Any, headers: dict[str, str] | None = None,
                  url: str | None = None) -> httpx2.AsyncClient:
    """An ``AsyncClient`` whose every response body is read through the cap (a response event hook,
    so it also holds through an environment proxy); no redirects, no compression. A loopback ``url``
    ignores the environment's proxy settings: a request to the local machine (with its key) never
    goes through a proxy, as for MCP endpoints."""
    return httpx2.AsyncClient(timeout=timeout, follow_redirects=False, limits=POOL_LIMITS,
                              trust_env=not is_loopback_url(url),
                              headers={"accept-encoding": "identity", **(headers or {})},
                              event_hooks={"response": [_cap_hook(limit)]})


def is_loopback_url(url: str | None) -> bool:
    """True for a URL whose host is ``localhost``, in 127.0.0.0/8 or ``::1`` (never resolved)."""
    if not url:
        return False
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    return is_loopback_host(host)


def transport_failure(exc: BaseException, server: str, *, read_timeout: float | None = None) -> Any:
    """The :class:`~relay_jupyter.backends.base.BackendFailure` for a transport-level exception (this
    one or any in its ``__cause__``/``__context__`` chain), or None when it is not one.

    - cannot connect -> ``BACKEND_UNREACHABLE``; the connection cut mid-answer -> ``BACKEND_UNREACHABLE``;
    - a read/connect/pool timeout -> ``BACKEND_TIMEOUT``;
    - an oversized or compressed event stream -> ``BACKEND_ERROR``.
    """
    from ..core.errors import Code
    from .base import failure

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = type(current).__name__
        if isinstance(current, StreamTooLarge):
            return failure(Code.BACKEND_ERROR,
                           f"{server} sent a stream event larger than {current.limit} bytes")
        if isinstance(current, StreamCompressed):
            return failure(Code.BACKEND_ERROR, f"{server} compressed its event stream ({current}) although "
                                               "relay asked for none")
        if isinstance(current, httpx2.ConnectTimeout):
            return failure(Code.BACKEND_UNREACHABLE, f"cannot reach {server} (connection timed out)")
        if isinstance(current, httpx2.TimeoutException):
            wait = f" for {read_timeout:g} s" if read_timeout else ""
            return failure(Code.BACKEND_TIMEOUT, f"{server} sent nothing{wait} ({kind})")
        if isinstance(current, (httpx2.ConnectError, httpx2.ProxyError, httpx2.UnsupportedProtocol)):
            return failure(Code.BACKEND_UNREACHABLE, f"cannot reach {server} ({kind})")
        if isinstance(current, (httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError,
                                httpx2.CloseError)):
            return failure(Code.BACKEND_UNREACHABLE, f"the connection to {server} was cut before the answer "
                                                     f"ended ({kind})")
        if isinstance(current, httpx2.TransportError):
            return failure(Code.BACKEND_UNREACHABLE, f"the connection to {server} failed ({kind})")
        if isinstance(current, httpx2.DecodingError):
            return failure(Code.BACKEND_ERROR, f"{server} sent a stream that cannot be decoded ({kind})")
        current = current.__cause__ or current.__context__
    return None
