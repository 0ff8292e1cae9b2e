"""Blocking store calls off the broker's event loop (issues 12 and 18).

The :class:`~relay_jupyter.core.ports.Store` protocol is synchronous and thread-safe; a call on the
event loop blocks every notebook's stream, every RPC and ``readyz`` for its duration: a PostgreSQL
statement waiting on a row lock another broker holds (the team's budget row) up to its
``statement_timeout`` (15 s), a SQLite write waiting for another process's write lock up to its
``busy_timeout`` (5 s). The callers of the gate and the store (the run loop, the executor, the
model endpoints) run those calls on one small thread pool of their own instead (not the loop's
default executor: calls parked on a lock must not starve the workspace tools and audit reads that
use it). The store's transaction is per thread (SQLite: the store lock held by the thread; PostgreSQL:
the pooled connection bound to the thread), so a function handed to :func:`off_loop` may open one and
call store methods inside it; they join it.

A call handed over always runs to its end, even when the task awaiting it is cancelled meanwhile:
its effect (a budget hold taken, an intent journalled, a run's end recorded) must be known before the
cancellation goes on, or it would be lost (a hold charged in full at its expiry, a run left
``running``). :func:`off_loop` waits for it and then re-raises the cancellation;
:func:`submit` + :func:`outcome` let a caller undo or deliver what the call did first. A cancelled
run therefore ends at most one store call later than before.

Event appends stay on the loop (docs/runtime.md, "What runs off the loop"): live delivery must follow
the store's id order, which one writer on the loop keeps.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["STORE_THREADS", "off_loop", "off_loop_or_undo", "outcome", "submit"]

T = TypeVar("T")

STORE_THREADS = 16
"""Worker threads for store calls: more than the PostgreSQL pool's 8 connections (a thread waiting
for a pooled connection fails after its pool timeout with STORAGE_ERROR, never hangs), and SQLite
admits one at a time anyway."""

_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="relay-store")
    return _pool


def submit(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """Start ``fn(*args, **kwargs)`` on a store thread (with the caller's context variables); the
    future of its result. Must be called on the event loop."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return loop.run_in_executor(_executor(), call)


async def outcome(future: asyncio.Future[Any]) -> bool:
    """Wait until ``future`` is done, through any number of cancellations of the waiting task.
    Returns True when the task was cancelled meanwhile (the caller re-raises ``CancelledError``
    once it has dealt with the result, which ``future`` holds)."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait((future,))  # asyncio.wait never cancels what it waits for
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


async def off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a store thread; its result, or its exception. A cancellation of the
    awaiting task waits for the call to end, then propagates (the call's result is dropped)."""
    future = submit(fn, *args, **kwargs)
    if await outcome(future):
        if not future.cancelled():
            future.exception()  # retrieved: a failure of a cancelled caller's call is not "never retrieved"
        raise asyncio.CancelledError
    return future.result()


async def off_loop_or_undo(undo: Callable[[T], Any], fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """:func:`off_loop`, for a call whose effect must not outlive a cancelled caller: when the awaiting
    task was cancelled meanwhile and the call succeeded, ``undo(result)`` runs (on a store thread,
    waited for) before the cancellation propagates. A budget hold taken for a request that will never be
    sent is released, not left to be charged in full at its expiry."""
    future = submit(fn, *args, **kwargs)
    if await outcome(future):
        if not future.cancelled() and future.exception() is None:
            await outcome(undone := submit(undo, future.result()))
            if not undone.cancelled():
                undone.exception()
        raise asyncio.CancelledError
    return future.result()
