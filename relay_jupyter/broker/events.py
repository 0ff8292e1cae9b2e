"""The event bus: every event is appended to the durable store, then fanned out to live subscribers.

Visibility (who may see an event) is decided here, once, for replay and live delivery alike:

- ``event.origin is None``: a broadcast, everyone authenticated sees it;
- otherwise only callers acting as that origin (its kernels, a daemon client of that name) and
  browser sessions of the user who owns the origin (on a Jupyter server: its one user).

Each live subscriber has a bounded buffer (:class:`Subscription`). Fan-out never blocks and never
grows memory: when a buffer is full the subscriber is marked overflowed and its ``on_overflow``
callback closes the connection; the client reconnects with ``since`` and replays from the store.

Subscribers are indexed by what they may see (browser sessions: everything; others: their origin),
so fan-out of an event costs the subscribers that get it, not every subscriber (issue 18).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..core.caller import Caller, CallerKind
from ..core.ports import EventItem, EventStore
from ..core.types import Event
from ..protocol.names import TERMINAL_EVENTS, EventType
from ..protocol.sse import encode_event, encode_raw

__all__ = ["EventBus", "Subscription", "can_see"]

log = logging.getLogger(__name__)


def can_see(caller: Caller, event: Event) -> bool:
    """True when ``caller`` may see ``event`` (rules in the module docstring)."""
    if event.origin is None:
        return True
    # A browser session is authenticated by Jupyter as the server's user, who owns every origin of this server;
    # a hub user's panel acts for the origins ``user:<name>/…`` of its user only; anyone else for its own origin.
    return caller.acts_for(event.origin)


class Subscription:
    """One live subscriber: a bounded FIFO of encoded frames plus a wake-up signal.

    The producer side (:meth:`offer`) runs on the event loop and never blocks. The consumer
    (the SSE handler) awaits :meth:`wait` and takes everything buffered with :meth:`drain`, so a
    burst of events becomes one socket write (coalescing).
    """

    def __init__(self, caller: Caller, maxsize: int, on_overflow: Callable[[], None] | None = None) -> None:
        self.caller = caller
        self.maxsize = maxsize
        self.on_overflow = on_overflow
        self.overflowed = False
        self.closed = False
        self.last_id = 0
        """Id of the newest event handed to the consumer (for the lag metric and de-duplication)."""
        self._frames: deque[tuple[int | None, bytes]] = deque()
        self._wakeup = asyncio.Event()

    def offer(self, event_id: int | None, frame: bytes) -> None:
        """Buffer one frame (``event_id`` None: an event the store could not record, see
        :meth:`EventBus.publish_unstored`); overflow marks the subscription and calls ``on_overflow`` once."""
        if self.closed or self.overflowed:
            return
        if len(self._frames) >= self.maxsize:
            self.overflowed = True
            self._frames.clear()  # memory is freed now, not when the handler notices
            self._wakeup.set()
            if self.on_overflow is not None:
                self.on_overflow()
            return
        self._frames.append((event_id, frame))
        self._wakeup.set()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until a frame is buffered (or overflow/close). False on timeout."""
        if self._frames or self.overflowed or self.closed:
            return True
        self._wakeup.clear()
        try:
            async with asyncio.timeout(timeout):
                await self._wakeup.wait()
        except TimeoutError:
            return False
        return True

    def drain(self) -> list[tuple[int | None, bytes]]:
        """Take every buffered (id, frame), oldest first."""
        frames = list(self._frames)
        self._frames.clear()
        self._wakeup.clear()
        return frames

    @property
    def pending(self) -> int:
        return len(self._frames)


class EventBus:
    """Append events durably and deliver them to live subscribers that may see them."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._subscribers: set[Subscription] = set()
        self._everything: set[Subscription] = set()
        """Browser sessions: they see every event."""
        self._by_origin: dict[str | None, set[Subscription]] = {}
        """Other subscribers by the origin they act as (None: broadcasts only)."""
        self._by_prefix: dict[str, set[Subscription]] = {}
        """Hub users' panels by their origin prefix (``user:<name>/``): an origin's first segment finds them."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self.active_runs: set[str] = set()
        """Runs that emitted ``run.started`` and no terminal event yet (a metric)."""
        self.appended = 0
        self.disconnects: dict[str, int] = {}
        self._soon: list[EventItem] = []
        """Group commit (issue 18): events queued by :meth:`append_soon`, stored in one transaction."""
        self._soon_failed: list[Callable[[Exception], None]] = []
        self._soon_handle: asyncio.Handle | None = None
        self.group_commits = 0
        """Transactions :meth:`flush` committed (a metric for the benchmarks)."""
        self.run_end_hooks: list[Callable[[str], None]] = []
        """Called with the run id when a run's terminal event passes (e.g. drop run-scoped allows)."""

    # -- producing ---------------------------------------------------------------------------------

    def append(self, type: str, data: dict[str, Any] | None = None, *, origin: str | None = None,
               run_id: str | None = None) -> Event:
        """Store one event and deliver it. Returns the stored event (with its id).

        May be called from a worker thread: delivery is then scheduled onto the bus's loop.
        """
        return self.append_many([(type, dict(data or {}), origin, run_id)])[0]

    def append_soon(self, type: str, data: dict[str, Any], *, origin: str | None, run_id: str | None,
                    on_error: Callable[[Exception], None]) -> None:
        """**Group commit** (issue 18): queue one event; every event queued during one turn of the event
        loop is stored in *one* transaction by :meth:`flush` (scheduled with ``call_soon``), then
        delivered. For a burst of ``run.text_delta`` of many runs: one commit instead of one per event.

        Order is kept: any other append, a stored or unstored publish, a replay page, and the run
        manager before it records a run's end, flush the queue first. Nothing queued is delivered
        before it is stored, so a crash loses at most the events of that one loop turn, which no
        client has seen. A failed flush (a full disk) calls each queued event's ``on_error`` with the
        ``StoreError`` (the run then ends with its code) and delivers nothing. Called off the bus's
        loop thread it appends at once."""
        loop = self._loop
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            else:
                self._loop, self._loop_thread = loop, threading.get_ident()
        if loop is None or threading.get_ident() != self._loop_thread:
            try:
                self.append(type, data, origin=origin, run_id=run_id)
            except Exception as exc:
                on_error(exc)
                raise
            return
        self._soon.append((type, data, origin, run_id))
        self._soon_failed.append(on_error)
        if self._soon_handle is None:
            self._soon_handle = loop.call_soon(self.flush)

    def flush(self) -> None:
        """Store and deliver what :meth:`append_soon` queued (one transaction). Never raises: a store
        failure goes to the queued events' ``on_error`` callbacks (each called once)."""
        if self._soon_handle is not None:
            self._soon_handle.cancel()
            self._soon_handle = None
        if not self._soon:
            return
        items, failed = self._soon, self._soon_failed
        self._soon, self._soon_failed = [], []
        try:
            events, frames = self.store.append_events_framed(items)
        except Exception as exc:
            for callback in dict.fromkeys(failed):
                try:
                    callback(exc)
                except Exception:  # a failing callback must not hide the others
                    log.exception("relay: event flush failure callback failed")
            return
        self.group_commits += 1
        self.appended += len(events)
        self._fanout(events, frames)

    def append_many(self, items: Sequence[EventItem]) -> list[Event]:
        """Store a batch of (type, data, origin, run_id) in one transaction and deliver it."""
        if self._soon and threading.get_ident() == self._loop_thread:
            self.flush()  # queued events (group commit) keep their place before this one
        # the store hands back the SSE frames it stored: encoding an event again (pydantic dump +
        # json) was most of the time between an append and its delivery
        events, frames = self.store.append_events_framed(items)
        self.appended += len(events)
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._fanout, events, frames)
        else:
            self._fanout(events, frames)
        return events

    def publish_stored(self, events: Sequence[Event], frames: Sequence[bytes] | None = None) -> None:
        """Deliver events a caller has already stored (in a transaction of its own, e.g. a run's
        terminal event committed together with the journal's terminal state)."""
        if self._soon and threading.get_ident() == self._loop_thread:
            self.flush()
        self.appended += len(events)
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._fanout, events, frames)
        else:
            self._fanout(events, frames)

    def publish_unstored(self, type: str, data: dict[str, Any], origin: str | None, run_id: str | None) -> None:
        """Deliver an event the store could not record (a full disk): live subscribers still see a
        run end. Its frame has no SSE ``id`` (and ``"id": null``), so a client's replay position
        does not move; ``data.stored`` is false. The store gets the event later (the run manager's
        repair), without a second live delivery."""
        if self._soon and threading.get_ident() == self._loop_thread:
            self.flush()
        data = {**data, "stored": False}
        probe = Event.model_construct(id=0, ts=time.time(), type=type, origin=origin, run_id=run_id, data=data)
        frame = encode_raw(None, type, {"id": None, "ts": probe.ts, "type": type, "origin": origin,
                                        "run_id": run_id, "data": data})

        def deliver() -> None:
            self._track_run(probe)
            for sub in self._audience(origin):
                sub.offer(None, frame)

        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(deliver)
        else:
            deliver()

    def _audience(self, origin: str | None) -> list[Subscription]:
        """The live subscribers that may see an event of ``origin`` (the rules of :func:`can_see`)."""
        if origin is None:
            return list(self._subscribers)
        mine = self._by_origin.get(origin)
        cut = origin.find("/")
        panels = self._by_prefix.get(origin[:cut + 1]) if cut >= 0 and self._by_prefix else None
        if panels:
            return [*self._everything, *(mine or ()), *(p for p in panels if p.caller.acts_for(origin))]
        return [*self._everything, *mine] if mine else list(self._everything)

    def _fanout(self, events: Sequence[Event], frames: Sequence[bytes] | None = None) -> None:
        for n, event in enumerate(events):
            self._track_run(event)
            if not self._subscribers:
                continue
            audience = self._audience(event.origin)
            if not audience:
                continue
            # encoded at most once (or taken from the store), shared by every subscriber
            frame = frames[n] if frames is not None else encode_event(event)
            for sub in audience:
                sub.offer(event.id, frame)

    def _index(self, sub: Subscription) -> None:
        if sub.caller.kind is CallerKind.BROWSER:
            self._everything.add(sub)
        elif sub.caller.kind is CallerKind.PANEL and sub.caller.origin_prefix:
            self._by_prefix.setdefault(sub.caller.origin_prefix, set()).add(sub)
        else:
            self._by_origin.setdefault(sub.caller.origin, set()).add(sub)

    def _unindex(self, sub: Subscription) -> None:
        self._everything.discard(sub)
        panels = self._by_prefix.get(sub.caller.origin_prefix or "")
        if panels is not None:
            panels.discard(sub)
            if not panels:
                del self._by_prefix[sub.caller.origin_prefix or ""]
        group = self._by_origin.get(sub.caller.origin)
        if group is not None:
            group.discard(sub)
            if not group:
                del self._by_origin[sub.caller.origin]

    def _track_run(self, event: Event) -> None:
        if event.run_id is None:
            return
        if event.type == EventType.RUN_STARTED:
            self.active_runs.add(event.run_id)
        elif event.type in TERMINAL_EVENTS:
            self.active_runs.discard(event.run_id)
            for hook in self.run_end_hooks:
                hook(event.run_id)

    # -- consuming ---------------------------------------------------------------------------------

    def subscribe(self, caller: Caller, *, maxsize: int, on_overflow: Callable[[], None] | None = None
                  ) -> Subscription:
        """Register a live subscriber. Must be called on the event loop that serves it."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._loop_thread = loop, threading.get_ident()
        sub = Subscription(caller, maxsize, on_overflow)
        self._subscribers.add(sub)
        self._index(sub)
        return sub

    def unsubscribe(self, sub: Subscription, reason: str = "closed") -> None:
        """Forget a subscriber (idempotent); ``reason`` is counted for the metrics."""
        if sub in self._subscribers:
            self._subscribers.discard(sub)
            self._unindex(sub)
            self.disconnects[reason] = self.disconnects.get(reason, 0) + 1
        sub.closed = True

    def follow(self, caller: Caller) -> int:
        """A kernel's origin is its notebook's path *now*: after a rename, its next request resolves the
        new origin, and its open event streams (authenticated with the old one) see that origin's events
        from then on — else the run it just started would stream into a filter that drops every event and
        the cell would wait forever. Only the same kernel client is moved; returns how many streams."""
        if caller.kind is not CallerKind.KERNEL or caller.origin is None:
            return 0
        moved = 0
        for sub in list(self._subscribers):
            old = sub.caller
            if old.kind is CallerKind.KERNEL and old.client_id == caller.client_id and old.origin != caller.origin:
                self._unindex(sub)
                sub.caller = caller
                self._index(sub)
                moved += 1
        return moved

    def replay_frames(self, caller: Caller, since: int, *, limit: int) -> tuple[int, bytes, bool]:
        """One page of replay: ``(next_since, frames, done)`` with the SSE frames of stored events
        after ``since`` that ``caller`` may see. A page scans at most ``limit`` stored events (it may
        hold no frame for this caller and still not be the last): bounded work per page, so the
        SSE handler yields to the loop between pages."""
        if self._soon and threading.get_ident() == self._loop_thread:
            self.flush()  # a replay sees every event appended so far
        if caller.kind is CallerKind.PANEL:
            # the store filters by exact origins; a hub user's origins are a prefix: scan the page, keep what
            # the panel may see (the same rule as live delivery), encode those
            events = self.store.events_since(since, limit=limit)
            if not events:
                return since, b"", True
            return events[-1].id, b"".join(encode_event(e) for e in events if can_see(caller, e)), False
        origins = None if caller.kind is CallerKind.BROWSER else ([caller.origin] if caller.origin else [])
        last, frames = self.store.replay_sse(since, limit=limit, origins=origins)
        return last, frames, last == since

    def last_event_id(self) -> int:
        return self.store.last_event_id()

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def kernel_clients(self, origin: str) -> set[str]:
        """The client ids of the kernels whose event stream is live for ``origin`` now (the kernels a
        live-only event of that origin reaches: broker/mcp_gateway.py routes kernel tools by it)."""
        return {s.caller.client_id for s in self._by_origin.get(origin, ())
                if s.caller.kind is CallerKind.KERNEL and not s.closed}

    def max_lag(self) -> int:
        """Events appended but not yet handed to the slowest live subscriber (buffered frames)."""
        return max((s.pending for s in self._subscribers), default=0)
