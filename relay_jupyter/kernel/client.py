"""The kernel's client of the broker: JSON-RPC over ``POST {url}rpc`` and SSE from ``GET {url}events``.

Transport: plain asyncio streams, chosen over tornado's ``AsyncHTTPClient`` because

- the standalone daemon listens on a Unix socket, which asyncio opens directly
  (``asyncio.open_unix_connection``) while tornado needs a custom resolver hack;
- ``AsyncHTTPClient`` is a per-loop singleton with ``max_clients=10``: long-lived SSE streams of
  several ``--bg`` runs would queue ordinary RPCs behind them, a deadlock we cannot afford on
  the kernel's loop;
- both paths stay non-blocking on the kernel's own event loop, which keeps processing widget
  clicks while a ``%%agent`` cell awaits.

The HTTP/1.1 subset we need is small (one request per connection, ``Content-Length`` or
``chunked`` bodies), and the response size is bounded so a hostile peer cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from ..core.errors import Code
from ..protocol.client_names import INSTANCE_HEADER, kernel_instance
from .errors import AgentError, BrokerUnreachable, RpcError

__all__ = ["MAX_RESPONSE_BYTES", "Endpoint", "RelayClient"]

#: An RPC response larger than this is refused (the broker's own results are small and bounded).
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
#: One SSE frame larger than this ends the stream (a broker frame is a few KiB at most).
MAX_FRAME_BYTES = 4 * 1024 * 1024
_MAX_HEADER_BYTES = 64 * 1024
#: This kernel's instance id on a JupyterHub thin server (None elsewhere): its client id there is its own.
_INSTANCE = kernel_instance(os.environ)


@dataclass(frozen=True)
class Endpoint:
    """Where the broker listens and how to authenticate to it. ``auth`` is a header value, never logged."""

    url: str
    """``http://host:port/prefix/relay/`` or ``unix:///path/to.sock`` (paths then start at ``/relay/``)."""
    auth: str | None = None
    """The ``Authorization`` header value (``RelayKernel <cred>`` or ``Bearer <token>``)."""
    client_name: str = "kernel"
    """Sent as ``X-Relay-Client`` so the broker can name this client in audits."""
    kernel_credential: str | None = None
    """The standalone daemon's credential for this kernel (``X-Relay-Kernel``; the daemon bound this kernel's
    origin to it: ``kernel/discovery.py register``). None inside Jupyter (``auth`` is the kernel's credential)."""
    notebook_claim: str | None = None
    """The notebook this kernel claimed when it registered (``X-Relay-Notebook``), sent again when it renews its
    credential (:meth:`RelayClient._renew`)."""

    def __repr__(self) -> str:  # never show the credential
        return (f"Endpoint(url={self.url!r}, auth={'<set>' if self.auth else None}"
                f"{', kernel_credential=<set>' if self.kernel_credential else ''})")

    @property
    def display(self) -> str:
        """The address, safe to print."""
        return self.url

    def _target(self) -> tuple[str, str, int | None, str, str]:
        """(kind, host_or_path, port, path_prefix, host_header)."""
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            # unix:///run/relay.sock -> socket path; the HTTP paths live under /relay/ as on TCP
            return "unix", parts.path, None, "/relay/", "localhost"
        if parts.scheme != "http":
            raise AgentError(f"unsupported RELAY_URL scheme {parts.scheme!r}: use http://127.0.0.1:PORT/relay/ "
                             "or unix:///path/to.sock")
        prefix = parts.path if parts.path.endswith("/") else parts.path + "/"
        port = parts.port or 80
        return "tcp", parts.hostname or "127.0.0.1", port, prefix, f"{parts.hostname}:{port}"


class _Response:
    def __init__(self, status: int, headers: dict[str, str], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.status = status
        self.headers = headers
        self.reader = reader
        self.writer = writer

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, de-chunked."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await self.reader.readline()
                if not size_line:
                    return
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    await self.reader.readline()
                    return
                if size > MAX_FRAME_BYTES:
                    raise AgentError("broker sent an oversized chunk; connection dropped")
                data = await self.reader.readexactly(size)
                await self.reader.readexactly(2)
                yield data
        elif "content-length" in self.headers:
            remaining = int(self.headers["content-length"])
            while remaining > 0:
                data = await self.reader.read(min(remaining, 65536))
                if not data:
                    return
                remaining -= len(data)
                yield data
        else:
            while data := await self.reader.read(65536):
                yield data

    async def body(self, limit: int = MAX_RESPONSE_BYTES) -> bytes:
        out = bytearray()
        async for chunk in self.chunks():
            out += chunk
            if len(out) > limit:
                raise AgentError("broker response too large; refused")
        return bytes(out)

    def close(self) -> None:
        self.writer.close()


class RelayClient:
    """One broker connection configuration. Each RPC uses its own short HTTP connection;
    :meth:`events` holds one streaming connection."""

    def __init__(self, endpoint: Endpoint, *, connect_timeout: float = 5.0, rpc_timeout: float = 60.0) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.rpc_timeout = rpc_timeout
        self._ids = itertools.count(1)
        self._renewing: asyncio.Lock | None = None
        self._not_renewed: Endpoint | None = None  # the credential a renewal could not replace: not tried again

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str, str]:
        kind, where, port, prefix, host = self.endpoint._target()
        try:
            async with asyncio.timeout(self.connect_timeout):
                if kind == "unix":
                    reader, writer = await asyncio.open_unix_connection(where, limit=MAX_FRAME_BYTES)
                else:
                    reader, writer = await asyncio.open_connection(where, port, limit=MAX_FRAME_BYTES)
        except (OSError, TimeoutError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise BrokerUnreachable(
                f"the relay broker is unreachable at {self.endpoint.display} ({reason}); start Jupyter with the "
                "relay extension, or run `jupyter relay serve`, or fix RELAY_URL") from None
        return reader, writer, prefix, host

    async def _request(self, verb: str, path: str, body: bytes | None = None,
                       accept: str = "application/json", headers: dict[str, str] | None = None) -> _Response:
        """One request; a daemon's 401 to a registered kernel renews its credential once and sends it again
        (:meth:`_renew`: the daemon's kernel key or TCP token was rotated and the old one is no longer accepted).
        A 401 is the daemon's answer before any method runs, so sending the request again repeats nothing."""
        sent_with = self.endpoint
        response = await self._send(verb, path, body, accept, headers)
        if response.status != 401 or sent_with.kernel_credential is None or path == "kernel":
            return response
        if not await self._renew(sent_with):
            return response  # the refusal, for the caller's error
        response.close()
        return await self._send(verb, path, body, accept, headers)

    async def _renew(self, refused: Endpoint) -> bool:
        """Register again with the daemon that refused ``refused`` (same address; the TCP token re-read from where
        it came from, ``RELAY_TOKEN`` or the token file) and use the new credential when the daemon binds it to
        the same origin. False when it does not: a kernel without a notebook path gets a fresh origin at every
        registration, so its grant cannot follow it (restart the kernel); or the daemon refused again."""
        if self._renewing is None:
            self._renewing = asyncio.Lock()
        async with self._renewing:
            if self.endpoint is not refused:  # another request renewed it meanwhile
                return True
            if self._not_renewed is refused:
                return False
            self._not_renewed = refused
            from .discovery import register, renewed_auth

            base = Endpoint(refused.url, renewed_auth(refused), "kernel", notebook_claim=refused.notebook_claim)
            try:
                fresh = await register(base, refused.notebook_claim, timeout=self.connect_timeout + 5)
            except AgentError:
                return False
            if fresh.kernel_credential is None or fresh.client_name != refused.client_name:
                return False
            self.endpoint = fresh
            return True

    async def _send(self, verb: str, path: str, body: bytes | None, accept: str,
                    headers: dict[str, str] | None) -> _Response:
        reader, writer, prefix, host = await self._open()
        lines = [f"{verb} {prefix}{path} HTTP/1.1", f"Host: {host}", f"Accept: {accept}",
                 f"X-Relay-Client: {self.endpoint.client_name}", "Connection: close"]
        if self.endpoint.auth:
            lines.append(f"Authorization: {self.endpoint.auth}")
        if self.endpoint.kernel_credential:
            lines.append(f"X-Relay-Kernel: {self.endpoint.kernel_credential}")
        if _INSTANCE:  # a hub thin server's id for this kernel (protocol/client_names.ENV_INSTANCE)
            lines.append(f"{INSTANCE_HEADER}: {_INSTANCE}")
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        try:
            await writer.drain()
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionResetError("connection closed before a response")
            parts = status_line.decode("latin-1").split(" ", 2)
            status = int(parts[1])
            headers: dict[str, str] = {}
            size = 0
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                size += len(line)
                if size > _MAX_HEADER_BYTES:
                    raise AgentError("broker response headers too large; refused")
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
            writer.close()
            raise BrokerUnreachable(f"the relay broker at {self.endpoint.display} dropped the connection "
                                    f"({type(exc).__name__})") from None
        return _Response(status, headers, reader, writer)

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   *, timeout: float | None = None) -> Any:
        """Call one JSON-RPC method; return its ``result``.

        Raises:
            RpcError: the broker refused (``.code`` is the stable string, e.g. ``BUDGET_EXCEEDED``).
            BrokerUnreachable: no connection, or the connection broke.
            AgentError: the answer was not a JSON-RPC response (wrong server, 401, oversized).
        """
        request_id = next(self._ids)
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}},
                          separators=(",", ":")).encode()
        try:
            async with asyncio.timeout(timeout or self.rpc_timeout):
                response = await self._request("POST", "rpc", body)
                try:
                    raw = await response.body()
                finally:
                    response.close()
        except TimeoutError:
            raise BrokerUnreachable(f"the relay broker did not answer {method} in time") from None
        except (OSError, asyncio.IncompleteReadError):
            raise BrokerUnreachable(f"the relay broker at {self.endpoint.display} dropped the connection") from None
        return _decode_rpc(method, response.status, raw)

    async def events(self, since: int | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield events (``{id, ts, type, run_id, data, ...}``) from the SSE stream until it ends.

        The generator yields ``{"type": "_connected"}`` once the response headers arrive, so a
        caller can wait for the subscription before it starts a run (no event is missed).
        """
        # imported here: protocol.sse pulls in the pydantic models of core.types (~0.2 s), which
        # %load_ext must not pay
        from ..protocol.sse import parse_stream

        path = "events" if since is None else f"events?since={quote(str(int(since)))}"
        response = await self._request("GET", path, accept="text/event-stream")
        try:
            if response.status != 200:
                raw = await response.body(limit=64 * 1024)
                raise _status_error(response.status, raw, "events")
            yield {"type": "_connected"}
            buffer = ""
            async for chunk in response.chunks():
                buffer += chunk.decode("utf-8", errors="replace")
                frames, buffer = parse_stream(buffer)
                if len(buffer) > MAX_FRAME_BYTES:
                    raise AgentError("broker sent an oversized event; stream dropped")
                for frame in frames:
                    try:
                        event = json.loads(frame["data"])
                    except ValueError:
                        continue  # a malformed frame is skipped, never trusted
                    if isinstance(event, dict):
                        event.setdefault("type", frame["event"])
                        yield event
        finally:
            response.close()


def _status_error(status: int, raw: bytes, method: str) -> AgentError:
    if status in (401, 403):
        return AgentError(f"the relay broker refused this kernel's credential (HTTP {status}); restart the "
                          "kernel (from the relay-enabled Jupyter server, or on a daemon whose kernel key was rotated) "
                          "or fix RELAY_TOKEN", code=Code.UNAUTHORIZED)
    if status == 413:
        return AgentError(f"the request for {method} was too large for the broker (HTTP 413)")
    return AgentError(f"the relay broker answered {method} with HTTP {status}; is RELAY_URL pointing at a relay "
                      "broker?")


def _decode_rpc(method: str, status: int, raw: bytes) -> Any:
    try:
        reply = json.loads(raw)
    except ValueError:
        raise _status_error(status, raw, method) from None
    if not isinstance(reply, dict) or reply.get("jsonrpc") != "2.0":
        raise _status_error(status, raw, method)
    error = reply.get("error")
    if error is not None:
        if not isinstance(error, dict):
            raise AgentError(f"the relay broker sent a malformed error for {method}")
        data = error.get("data") if isinstance(error.get("data"), dict) else {}
        try:
            rpc_code = int(error.get("code", -32603))
        except (TypeError, ValueError):
            rpc_code = -32603
        raise RpcError(rpc_code, str(error.get("message", "error"))[:500], data, method)
    if status >= 400:
        raise _status_error(status, raw, method)
    return reply.get("result")
