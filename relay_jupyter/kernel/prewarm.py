"""Pre-warm at ``%load_ext relay_jupyter``: get the first ``%%agent`` cell's broker work done early.

Measured (issue 8, fresh kernel behind a relay Jupyter server): before a first cell can send
``run.start`` it needs the broker endpoint, ``grants.get`` and a live event stream. Done by the cell
itself these cost a few milliseconds of round trips (plus, until the SSE module stopped importing
pydantic, 0.1-0.25 s of imports). ``%load_ext`` schedules them as one background task on the
kernel's asyncio loop instead, so the first cell usually finds them ready.

Rules (they keep ``%load_ext`` cheap and its output empty):

- the task is only *scheduled* at load (``%load_ext`` stays as fast as before);
- it never starts a daemon: it connects only to ``RELAY_URL`` or to a daemon socket that already
  answers;
- it never displays or prints anything, and never raises into the load cell: a failure is kept in
  ``session.prewarm_error`` (for a developer) and the first cell simply does that step itself and,
  if it fails again, reports it as it always did;
- a grant found by it only counts if nobody changed the grant state meanwhile (``relay.connect``,
  a revoke), so the first cell's connect-card behaviour is unchanged;
- it is bounded (``PREWARM_TIMEOUT``); a client it made whose event stream did not open is dropped,
  so the first cell discovers afresh (and may then start the daemon, as before).

Without a running loop (terminal IPython outside an async cell) nothing is scheduled.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING

from .client import RelayClient

if TYPE_CHECKING:
    from .session import Session

__all__ = ["PREWARM_TIMEOUT", "prewarm", "schedule_prewarm", "wait_prewarm"]

#: Upper bound of the whole pre-warm; a first cell that arrives meanwhile waits at most this long for it.
PREWARM_TIMEOUT = 5.0


def schedule_prewarm(session: Session) -> asyncio.Task[None] | None:
    """Start :func:`prewarm` in the background on the running loop; None when there is no running loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    task = loop.create_task(prewarm(session), name="relay-prewarm")
    session.prewarm_task = task
    # the answer renderer's first use imports and builds markdown-it and nh3 (0.1-0.25 s, measured in a
    # fresh kernel: it held the kernel's loop while the first cell showed its working indicator, issue
    # 18); done in a thread, it never blocks the loop, and the first cell is not made to wait for it
    threading.Thread(target=_warm_renderer, name="relay-prewarm-render", daemon=True).start()
    return task


def _warm_renderer() -> None:
    with contextlib.suppress(Exception):  # the first cell builds it itself, as before
        from .render import INDICATOR
        from .rendering import markdown_html

        markdown_html(INDICATOR)


async def prewarm(session: Session, timeout: float = PREWARM_TIMEOUT) -> None:
    """Discover the broker (no daemon start), then ``grants.get`` and open the event stream at once.

    Never raises (except cancellation): failures end up in ``session.prewarm_error``.
    """
    made: RelayClient | None = None
    try:
        async with asyncio.timeout(timeout):
            if session.client is None:
                endpoint = await session.discover(start_daemon=False)
                if session.client is None:  # nobody (a relay.* helper) set one while we looked
                    made = session.adopt(RelayClient(endpoint))
            # the first cell imports these; here they cost the cell nothing (no pydantic, no widgets)
            import IPython.display  # noqa: F401

            from ..protocol import sse  # noqa: F401

            await asyncio.gather(_grant(session), _stream(session))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the first cell redoes the step and reports it; a task must not fail
        session.prewarm_error = f"{type(exc).__name__}: {exc}"
    if made is not None and session.client is made and not (session.pump and session.pump.connected.is_set()):
        # never connected: forget the endpoint, so the first cell discovers (and may start a daemon)
        session.drop_client()


async def _grant(session: Session) -> None:
    client = session.client
    if client is None or session.connected_origin:
        return
    await session.refresh_grant(client, timeout=PREWARM_TIMEOUT)  # the cell's own grants.get handling


async def _stream(session: Session) -> None:
    pump = session.pump
    if pump is None:
        return
    await pump.start(timeout=PREWARM_TIMEOUT)


async def wait_prewarm(session: Session) -> None:
    """Let a pre-warm still in flight finish (bounded by its own timeout); never raises its errors.

    ``asyncio.wait`` does not cancel the task when the waiting cell is interrupted.
    """
    task = session.prewarm_task
    if task is None:
        return
    if not task.done():
        await asyncio.wait({task})
    session.prewarm_task = None
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()
