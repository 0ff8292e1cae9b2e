"""A small HTTP/1.1 server on 127.0.0.1 running in its own thread and asyncio loop.

The fakes need byte-level control of a streaming response (pacing, flushing each SSE frame, dropping
the connection mid-stream) and must work from sync tests, async tests, notebooks and benchmarks alike.
aiohttp is not installed and tornado/uvicorn would want to own the caller's loop, so this is a minimal
HTTP/1.1 server on ``asyncio.start_server``: keep-alive, Content-Length and chunked request bodies,
chunked streaming responses, header and body size limits. It is a test double, not a production server.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import threading
from urllib.parse import parse_qsl, urlsplit

from .exchange import ClientDisconnected, HTTPRequest, RecordedRequest, Responder

__all__ = ["CLOSE", "REDACTED", "ClientDisconnected", "HTTPRequest", "LoopbackServer", "RecordedRequest", "Responder"]

REDACTED = "[REDACTED]"
_SECRET_HEADERS = ("authorization", "x-api-key", "api-key", "proxy-authorization")
_MAX_HEADER_BYTES = 64 * 1024


#: Header of an answer after which the server closes the connection (400/413 before the request was read).
CLOSE = {"connection": "close"}


class LoopbackServer:
    """Base of the fakes: start/stop in a background thread, record requests, check the API key.

    Subclasses implement :meth:`handle`. Use as a context manager, or call :meth:`start` / :meth:`stop`.
    """

    def __init__(self, api_key: str | None = None, max_body_bytes: int = 32 * 1024 * 1024) -> None:
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self._requests: list[RecordedRequest] = []
        self._key_digests: set[bytes] = set()
        #: exceptions raised inside the fake while answering (a bug in the fake, never in the client)
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port: int = 0

    # ----- lifecycle -------------------------------------------------------------------------
    def start(self) -> LoopbackServer:
        """Listen on 127.0.0.1 on an ephemeral port; returns self. Idempotent."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, "127.0.0.1", 0, limit=_MAX_HEADER_BYTES)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller of start()
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"{type(self).__name__}-loop", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Close the listener and every open connection, then join the thread. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def shutdown() -> None:
            try:
                assert self._server is not None
                self._server.close()
                for task in list(self._tasks):
                    task.cancel()
                if self._tasks:
                    await asyncio.gather(*self._tasks, return_exceptions=True)
                await self._server.wait_closed()
            finally:
                loop.stop()  # whatever happened above, the thread must end

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        thread.join(timeout=10)
        self._thread = None
        self._loop = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self):
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (for the Anthropic SDK's ``base_url``)."""
        if not self.port:
            raise RuntimeError(f"{type(self).__name__} is not started; use `with {type(self).__name__}()`")
        return f"http://127.0.0.1:{self.port}"

    # ----- recording ---------------------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> RecordedRequest:
        """The most recent request. Raises ``LookupError`` when none arrived."""
        with self._lock:
            if not self._requests:
                raise LookupError("no request received yet")
            return self._requests[-1]

    def saw_api_key(self, key: str) -> bool:
        """Whether any request carried ``key`` (recorded as a digest, never in clear)."""
        digest = hashlib.sha256(key.encode()).digest()
        with self._lock:
            return any(hmac.compare_digest(digest, d) for d in self._key_digests)

    def clear_requests(self) -> None:
        """Forget recorded requests and seen keys."""
        with self._lock:
            self._requests.clear()
            self._key_digests.clear()

    def presented_key(self, request: HTTPRequest) -> str | None:
        """The API key a request carries: ``x-api-key``, ``api-key`` or ``Authorization: Bearer``."""
        for name in ("x-api-key", "api-key"):
            if name in request.headers:
                return request.headers[name]
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        return None

    def key_ok(self, request: HTTPRequest) -> bool:
        """True when no key is configured, or the presented key matches (constant time)."""
        if self.api_key is None:
            return True
        presented = self.presented_key(request)
        return presented is not None and hmac.compare_digest(presented.encode(), self.api_key.encode())

    # ----- the connection loop -----------------------------------------------------------------
    async def handle(self, request: HTTPRequest, record: RecordedRequest, responder: Responder) -> None:
        """Answer one request. Overridden by each fake."""
        await responder.send(404, {"error": "not found"})

    async def bad_request(self, responder: Responder, status: int, message: str) -> None:
        """Answer a malformed HTTP request (before it reached :meth:`handle`). The connection closes after it,
        and the answer says so (``CLOSE``): a client must not send its next request on it."""
        await responder.send(status, {"error": {"type": "invalid_request_error", "message": message}}, CLOSE)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # so stop() can cancel a handler that is pacing or hanging
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Nagle would hold back small SSE frames (22 ms p99 with it on, measured on loopback).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ClientDisconnected, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # stop(): fall through to close
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read, record and answer one request; False when the connection must close."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            record = RecordedRequest("?", "?", {}, {}, None, 0)
            await self.bad_request(Responder(writer, record), 400, "request head too large")
            return False
        except asyncio.IncompleteReadError:
            return False
        try:
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, version = request_line.split(" ")
            if not version.startswith("HTTP/1."):
                raise ValueError(version)
            headers: dict[str, str] = {}
            for line in header_lines:
                if not line:
                    continue
                name, sep, value = line.partition(":")
                if not sep or not name or name != name.strip():
                    raise ValueError(line)
                headers[name.lower()] = value.strip()
        except ValueError:
            record = RecordedRequest("?", "?", {}, {}, None, 0)
            await self.bad_request(Responder(writer, record), 400, "malformed HTTP request")
            return False
        url = urlsplit(target)
        safe_headers = {k: (REDACTED if k in _SECRET_HEADERS else v) for k, v in headers.items()}
        record = RecordedRequest(method, url.path, dict(parse_qsl(url.query)), safe_headers, None, 0)
        responder = Responder(writer, record)
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl sends this for bodies over 1 KB
        body = await self._read_body(reader, headers, responder, record)
        if body is None:
            return False
        try:
            record.body = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError):
            record.body = None
        record.raw_size = len(body)
        request = HTTPRequest(method, url.path, record.query, headers, body)
        key = self.presented_key(request)
        with self._lock:
            self._requests.append(record)
            if key is not None:
                self._key_digests.add(hashlib.sha256(key.encode()).digest())
        try:
            await self.handle(request, record, responder)
        except ClientDisconnected:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in the fake: answer 500 and keep it for the test
            with self._lock:
                self.errors.append(exc)
            if record.status is None:
                await responder.send(500, {"error": {"type": "api_error",
                                                     "message": f"fake server error: {exc!r}"}})
            return False
        finally:
            record._finished.set()
        if not record.completed:
            return False
        return headers.get("connection", "").lower() != "close"

    async def _read_body(
        self, reader: asyncio.StreamReader, headers: dict[str, str], responder: Responder,
        record: RecordedRequest,
    ) -> bytes | None:
        """The request body, or None after answering 400/413 (the connection then closes)."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            size = 0
            while True:
                line = await reader.readuntil(b"\r\n")
                try:
                    n = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    await self.bad_request(responder, 400, "malformed chunked body")
                    return None
                if n == 0:
                    await reader.readuntil(b"\r\n")  # no trailers expected
                    return b"".join(parts)
                size += n
                if size > self.max_body_bytes:
                    await self.too_large(responder)
                    return None
                parts.append(await reader.readexactly(n))
                await reader.readexactly(2)
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            await self.bad_request(responder, 400, "bad Content-Length")
            return None
        length = int(length_text)
        if length > self.max_body_bytes:
            record.raw_size = length
            with self._lock:
                self._requests.append(record)
            await self.too_large(responder)
            return None
        return await reader.readexactly(length) if length else b""

    async def too_large(self, responder: Responder) -> None:
        """Answer a body above ``max_body_bytes``."""
        await self.bad_request(responder, 413, "request body too large")
