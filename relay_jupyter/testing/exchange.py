"""One HTTP exchange as the fakes see it: the parsed request, what is recorded of it, and the writer
of the response (whole, or streamed in chunks, or cut)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["REASONS", "ClientDisconnected", "HTTPRequest", "RecordedRequest", "Responder"]

REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 413: "Payload Too Large", 429: "Too Many Requests",
    500: "Internal Server Error", 503: "Service Unavailable", 529: "Overloaded",
}


@dataclass
class HTTPRequest:
    """A parsed request as the handler sees it (headers lower-cased, secrets still present)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class RecordedRequest:
    """What the fake remembers of one request. Secret headers are replaced by ``[REDACTED]``.

    Attributes:
        method, path, query, headers: as received (path without the query string).
        body: the parsed JSON body, or ``None`` when it was absent or not JSON.
        raw_size: body size in bytes.
        status: the HTTP status answered.
        disconnected: the client went away before the response was complete.
        completed: the full response was written.
    """

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    raw_size: int
    status: int | None = None
    disconnected: bool = False
    completed: bool = False
    received_at: float = field(default_factory=time.monotonic)
    _finished: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def wait_finished(self, timeout: float | None = None) -> bool:
        """Block until the response was completed or the client disconnected; False on timeout."""
        return self._finished.wait(timeout)

    @property
    def json(self) -> Any:
        """Alias of :attr:`body`."""
        return self.body


class ClientDisconnected(Exception):
    """The client closed the connection while we were writing."""


class Responder:
    """Writes one response; a handler calls :meth:`send` once, or :meth:`start_stream` then
    :meth:`write` / :meth:`end`. Every write is drained so each SSE frame leaves immediately."""

    def __init__(self, writer: asyncio.StreamWriter, record: RecordedRequest) -> None:
        self._writer = writer
        self._record = record
        self._streaming = False

    async def _write(self, data: bytes) -> None:
        if self._writer.is_closing():
            self._record.disconnected = True
            raise ClientDisconnected
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._record.disconnected = True
            raise ClientDisconnected from exc

    def _head(self, status: int, headers: dict[str, str]) -> bytes:
        self._record.status = status
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        """A complete response; ``body`` is bytes, or anything JSON-serialisable."""
        if isinstance(body, (bytes, bytearray)):
            data, ctype = bytes(body), "application/octet-stream"
        else:
            data, ctype = json.dumps(body).encode(), "application/json"
        head = {"content-type": ctype, **(headers or {}), "content-length": str(len(data))}
        await self._write(self._head(status, head) + data)
        self._record.completed = True

    async def start_stream(self, headers: dict[str, str] | None = None, status: int = 200) -> None:
        """Begin a chunked ``text/event-stream`` response."""
        head = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            **(headers or {}),
            "transfer-encoding": "chunked",
        }
        self._streaming = True
        await self._write(self._head(status, head))

    async def write(self, data: bytes) -> None:
        """One chunk of the streamed body, flushed."""
        if data:
            await self._write(b"%x\r\n%s\r\n" % (len(data), data))

    async def end(self) -> None:
        """Finish the streamed body."""
        await self._write(b"0\r\n\r\n")
        self._record.completed = True

    async def abort(self) -> None:
        """Drop the connection without finishing the response (a network failure mid-stream)."""
        self._record.disconnected = True
        self._writer.transport.abort()
