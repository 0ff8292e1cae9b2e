"""The relay endpoints as tornado mixins, independent of how a caller is authenticated.

A concrete handler combines one of these with an auth base that sets ``self.relay_caller``
(a :class:`~relay_jupyter.core.caller.Caller`) in ``prepare``: Jupyter's identity inside the Jupyter
server (``server/handlers.py``), a socket peer or bearer token in the standalone daemon
(:func:`relay_jupyter.server.plain.make_app`). The broker comes from ``settings["relay_broker"]``.

Paths (under ``{base_url}relay/``): ``rpc`` (POST), ``events`` (GET, SSE), ``healthz``, ``readyz``,
``metrics`` (GET).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from tornado import web
from tornado.iostream import StreamClosedError

from ..broker.broker import Broker
from ..broker.metrics import CONTENT_TYPE
from ..core.caller import Caller
from ..core.types import Event
from ..protocol.names import EventType
from ..protocol.sse import encode_comment, encode_event

__all__ = [
    "REPLAY_PAGE",
    "EventsEndpoint",
    "HealthEndpoint",
    "MetricsEndpoint",
    "ReadyEndpoint",
    "RelayEndpoint",
    "RpcEndpoint",
    "parse_since",
]

log = logging.getLogger("relay_jupyter.server")

#: Stored events read per replay page.
REPLAY_PAGE = 500
_MAX_SINCE_DIGITS = 19  # int64


def parse_since(raw: str | None, last_id: int) -> int:
    """Validate a ``since`` value: a decimal integer in ``[0, last_id]``; absent = ``last_id`` (live only).

    Raises:
        ValueError: a message the client can act on.
    """
    if raw is None:
        return last_id
    text = raw.strip()
    if not text.isdigit() or not text.isascii() or len(text) > _MAX_SINCE_DIGITS:
        raise ValueError("since must be a non-negative integer event id")
    since = int(text)
    if since > last_id:
        raise ValueError(f"since={since} is ahead of the event store (newest id {last_id}); "
                         "reconnect with since=0")
    return since


class RelayEndpoint(web.RequestHandler):
    """Shared parts: the broker, the authenticated caller, JSON errors."""

    relay_caller: Caller | None = None

    @property
    def relay_broker(self) -> Broker:
        return self.settings["relay_broker"]

    def relay_json(self, status: int, payload: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    def count(self, endpoint: str) -> None:
        self.relay_broker.metrics.http.labels(endpoint, str(self.get_status())).inc()


class RpcEndpoint(RelayEndpoint):
    """``POST rpc``: JSON-RPC 2.0. Use with ``@tornado.web.stream_request_body`` on the concrete class.

    The body is streamed in and counted: a Content-Length over the limit is refused with 413 in
    ``prepare`` before any of it is read; a chunked body is counted and dropped past the limit
    (413), and tornado's own cap (4x the limit) closes a connection that keeps sending.
    """

    _relay_chunks: list[bytes]
    _relay_size: int = 0
    _relay_too_large: bool = False

    def relay_prepare_body(self) -> None:
        """Call from ``prepare`` after authentication."""
        limit = self.relay_broker.config.max_body_bytes
        self._relay_chunks = []
        self._relay_size = 0
        self._relay_too_large = False
        length = self.request.headers.get("Content-Length")
        if length is not None:
            if not length.isdigit() or not length.isascii():
                raise web.HTTPError(400, "bad Content-Length")
            if int(length) > limit:
                raise web.HTTPError(413, f"request body larger than {limit} bytes")
        if self.request.connection is not None and hasattr(self.request.connection, "set_max_body_size"):
            self.request.connection.set_max_body_size(limit * 4)

    def data_received(self, chunk: bytes) -> None:
        if self._relay_too_large:
            return
        self._relay_size += len(chunk)
        if self._relay_size > self.relay_broker.config.max_body_bytes:
            self._relay_too_large = True
            self._relay_chunks = []  # free what was buffered
            return
        self._relay_chunks.append(chunk)

    async def relay_post(self) -> None:
        """Dispatch the body for ``self.relay_caller``; 204 when only notifications were sent."""
        if self._relay_too_large:
            raise web.HTTPError(413, f"request body larger than {self.relay_broker.config.max_body_bytes} bytes")
        assert self.relay_caller is not None
        body = b"".join(self._relay_chunks)
        self._relay_chunks = []
        response = await self.relay_broker.dispatch(self.relay_caller, body)
        if response is None:
            self.set_status(204)
            self.finish()
        else:
            self.set_header("Content-Type", "application/json")
            self.finish(response)
        self.count("rpc")


class EventsEndpoint(RelayEndpoint):
    """``GET events?since=<id>``: SSE replay from the store, then live, filtered to what the caller may see.

    ``since`` may also come as the ``Last-Event-ID`` header (EventSource reconnects). Absent: live
    events only. The stream has TCP_NODELAY (tornado leaves Nagle on, which costs ~20 ms per
    event), a heartbeat comment every ``heartbeat_interval`` seconds, and coalesces whatever is
    buffered into one write. A subscriber whose bounded buffer overflows is disconnected.
    """

    _relay_stream_closed = False

    def on_connection_close(self) -> None:
        self._relay_stream_closed = True
        sub = getattr(self, "_relay_sub", None)
        if sub is not None:
            sub.closed = True
            sub._wakeup.set()
        super().on_connection_close()

    def _overflowed(self) -> None:
        self._relay_stream_closed = True
        stream = self.request.connection.stream if self.request.connection is not None else None
        if stream is not None:
            stream.close()

    async def relay_get(self) -> None:
        broker = self.relay_broker
        caller = self.relay_caller
        assert caller is not None
        bus = broker.events
        raw = self.get_query_argument("since", None)
        if raw is None:
            raw = self.request.headers.get("Last-Event-ID")
        try:
            since = parse_since(raw, bus.last_event_id())
        except ValueError as exc:
            self.relay_json(400, {"message": str(exc), "last_event_id": bus.last_event_id()})
            self.count("events")
            return
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache, no-store")
        self.set_header("X-Accel-Buffering", "no")
        stream = self.request.connection.stream
        stream.set_nodelay(True)
        self.count("events")
        sub = None
        reason = "client closed"
        try:
            # permission requests still pending from before `since`: the originator gets them again
            resend = [p for p in broker.permissions.pending_for(caller) if p.event_id <= since]
            head = b"".join(
                encode_event(Event(id=p.event_id, ts=p.created_at, type=EventType.PERMISSION_REQUEST,
                                   origin=p.origin, run_id=p.request.request.run_id, data=p.payload))
                for p in resend)
            self.write(head or encode_comment("relay"))
            await self.flush()
            while True:
                nxt, frames, done = bus.replay_frames(caller, since, limit=REPLAY_PAGE)
                if done:
                    # no await between the empty page and subscribing: nothing can fall in between
                    sub = bus.subscribe(caller, maxsize=broker.config.sse_queue_size,
                                        on_overflow=self._overflowed)
                    self._relay_sub = sub
                    break
                since = nxt
                if frames:
                    self.write(frames)
                    await self.flush()
                    broker.metrics.events_sent.inc(frames.count(b"\nevent: "))
                else:  # a page of other origins' events: let the loop run before the next one
                    await asyncio.sleep(0)
            last_sent = since
            heartbeat = broker.config.heartbeat_interval
            while not self._relay_stream_closed:
                got = await sub.wait(heartbeat)
                if sub.overflowed:
                    reason = "slow subscriber"
                    break
                if sub.closed:
                    break
                if not got:
                    self.write(encode_comment("heartbeat"))
                    await self.flush()
                    continue
                # an id of None: an event the store could not record (a full disk), delivered live once
                batch = [(i, f) for i, f in sub.drain() if i is None or i > last_sent]
                if not batch:
                    continue
                last_sent = max((i for i, _ in batch if i is not None), default=last_sent)
                sub.last_id = last_sent
                self.write(b"".join(f for _, f in batch))
                await self.flush()
                broker.metrics.events_sent.inc(len(batch))
        except StreamClosedError:
            if sub is not None and sub.overflowed:
                reason = "slow subscriber"
        finally:
            if sub is not None:
                if sub.overflowed:
                    reason = "slow subscriber"
                bus.unsubscribe(sub, reason)
            broker.metrics.sse_disconnects.labels(reason).inc()
        if self._relay_stream_closed or stream.closed():
            # nothing more can be written; mark the response done so tornado does not try to
            self._finished = True
            return
        self.finish()


class HealthEndpoint(RelayEndpoint):
    """``GET healthz``: the process answers."""

    def relay_get(self) -> None:
        self.relay_json(200, {"status": "ok"})
        self.count("healthz")


class ReadyEndpoint(RelayEndpoint):
    """``GET readyz``: 200 when the broker accepts work; 503 while starting or stopping, and while its
    store cannot be written (``code`` STORAGE_FULL / STORAGE_ERROR and a ``message`` saying what to do)."""

    def relay_get(self) -> None:
        broker = self.relay_broker
        problem = broker.storage_problem()
        ready = bool(broker.ready) and problem is None
        body: dict[str, Any] = {"ready": ready, "last_event_id": broker.events.last_event_id()}
        if problem is not None:
            body.update(code=problem.code.value, message=problem.message)
        self.relay_json(200 if ready else 503, body)
        self.count("readyz")


class MetricsEndpoint(RelayEndpoint):
    """``GET metrics``: Prometheus text (requests, decisions by code, active runs, event lag)."""

    def relay_get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.relay_broker.metrics.render())
        self.count("metrics")
