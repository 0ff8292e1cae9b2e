"""Streaming an answer into cell outputs with provably bounded iopub traffic.

Layout of a cell's outputs while a run streams::

    [block 1]            the paragraph while it grows (plain text), then (same display) its rendering
    [block 2]
    [card / tool step]   widgets, shown between blocks
    [live display]       the paragraph still growing (``▍`` at its end), or the working indicator
                         while nothing streams (the run's start, after a card or a tool step, a stall)

A paragraph is shown in one display: a few partial updates while it grows (its raw text as
``text/plain``: an unfinished block is never parsed as Markdown, nor sent as HTML), then one last update
that *is* its rendering
(:func:`~relay_jupyter.kernel.rendering.markdown_html`: ``text/html`` sanitised by nh3, plus the raw
text as ``text/plain``); the next paragraph opens a new display lazily below it. A finished block is
never sent again. The indicator is not appended to every update: it lives in the live display only
while no text is growing there.

**What is final and what is interim** (issue 18, the lead's decision). The *final* form of every
paragraph (its ``text/html`` and its ``text/plain`` fallback) and the footer with the run's provenance
metadata are what a saved notebook, nbconvert and a text-only frontend keep: they are complete and sent
once. The partial views of a growing paragraph are *interim*: they exist only so a person sees the text
arrive, and they are sent only as often as that needs: when the paragraph has shown nothing for
``refresh`` seconds (1 s). A paragraph that finishes within that second is sent once, as its final
form; before this rule a partial view was also sent whenever the new text paid for it (``new >= 0.6 x
(shown + C)``), about one per paragraph of a normal answer, 0.7x the answer in bytes.

**Byte bound.** Let ``C`` (:data:`OVERHEAD`, about 100) be the fixed bytes of one output message. A
partial update is sent only when

1. nothing was sent for ``refresh`` seconds (1 s) while text is waiting (a person sees text arrive at
   least every second; such an update costs at most ``max_tail + C``), or
2. the live display shows only the indicator (the first text of a run, or after a card: at once, even
   within ``interval`` of the indicator: one message per indicator shown),

and never more often than every ``interval`` seconds. The block's final update costs ``H * P + C`` for
a block of ``P`` characters and is its only complete copy. The tail is cut into a block at
``max_tail`` (:data:`MAX_TAIL` = 600) characters, preferring a sentence end
(:class:`~relay_jupyter.kernel.segmenter.Segmenter`). For an answer of ``A`` characters in ``B`` blocks
streamed over ``D`` seconds the output bytes are at most::

    A * H  +  C * (2B + 3)  +  (max_tail + C) * D / refresh

where ``H`` (about 2.1 for prose) is the size of a block's final bundle per character: its HTML and its
text/plain fallback.

The last term is the price of the visible refresh; it matters only for slow streams of long
paragraphs (about ``(L + C) / (rate * refresh)`` per answer byte). ``tests/kernel/test_streaming_bytes.py``
measures it in a real kernel (the figures are in docs/kernel.md). At the end the answer stays as
``text/html`` + ``text/plain`` outputs: a saved notebook reads well without widgets or a kernel.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from .rendering import markdown_html, visible
from .segmenter import Segmenter

__all__ = ["OVERHEAD", "REFRESH", "DisplaySink", "Output", "Sink", "StreamView", "TextSink"]

Output = dict[str, str]
"""A display bundle: ``{"text/html": ..., "text/plain": ...}`` (a live update may carry only text/html)."""

INDICATOR = "*working…*"
CURSOR = "▍"
REFRESH = 1.0
"""Seconds a growing paragraph may show nothing new before a partial view of it is sent (interim output)."""
OVERHEAD = 100
"""Approximate fixed bytes of one ``update_display_data`` content (keys, display id), in characters."""
MAX_TAIL = 600
"""Characters after which a growing paragraph is cut into a block (bounds every refresh update)."""


#: ``markdown_html(INDICATOR)``, written out (``tests/kernel/test_render.py`` checks they agree): the
#: working indicator is a run's first output, and the renderer's first use builds markdown-it and nh3
#: (0.1-0.3 s on a busy machine). Measured (issue 18, timestamps in fresh kernels): when a cell followed
#: ``%load_ext`` at once, before the pre-warm thread had built them, the indicator held the kernel's
#: loop 85-190 ms after ``run.start`` returned, and the run's events waited behind it. Now the first
#: text (plain text) never waits for the renderer; the first finished paragraph is its first use.
INDICATOR_HTML = "<p><em>working…</em></p>\n"


def _own(markdown: str) -> Output:
    """The kernel's own short Markdown (indicator, footer; a run id in it comes from the broker),
    rendered by the same function as model text."""
    if markdown == INDICATOR:
        return {"text/html": INDICATOR_HTML, "text/plain": markdown}
    return {"text/html": markdown_html(markdown), "text/plain": markdown} if markdown else {}


class Sink(Protocol):
    """Where the view writes. ``show`` opens a new output (optionally updatable); ``update`` replaces one.
    An empty bundle clears an output."""

    def show(self, output: Output, display_id: str | None) -> None: ...
    def update(self, output: Output, display_id: str) -> None: ...


def _with_metadata(call: Callable[..., Any], *args: Any, metadata: dict[str, Any] | None) -> None:
    """``call(*args)``, with ``metadata=`` only when there is some (a :class:`Sink` need not take it)."""
    if metadata:
        call(*args, metadata=metadata)
    else:
        call(*args)


class DisplaySink:
    """IPython rich display of the bundles (already rendered by :mod:`.rendering`), updated by display id."""

    def show(self, output: Output, display_id: str | None, *, metadata: dict[str, Any] | None = None) -> None:
        from IPython.display import display

        display(output or {"text/plain": ""}, raw=True, display_id=display_id, metadata=metadata)

    def update(self, output: Output, display_id: str, *, metadata: dict[str, Any] | None = None) -> None:
        from IPython.display import update_display

        update_display(output or {"text/plain": ""}, raw=True, display_id=display_id, metadata=metadata)


class TextSink:
    """A terminal: text is printed as it arrives (no updates there, so no coalescing is needed)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout

    def show(self, output: Output, display_id: str | None) -> None:
        if display_id is None and output.get("text/plain"):
            self.stream.write(output["text/plain"] + "\n")
            self.stream.flush()

    def update(self, output: Output, display_id: str) -> None:
        return None


class StreamView:
    """Renders one run's text. Feed deltas with :meth:`text`; call :meth:`pause` before showing a card
    or tool step, :meth:`resume` after it, :meth:`status` to change the indicator and :meth:`finish`
    at the end."""

    def __init__(self, sink: Sink | None = None, *, interval: float = 0.1, refresh: float = REFRESH,
                 idle: float = 1.5, max_tail: int = MAX_TAIL, clock: Callable[[], float] = time.monotonic,
                 schedule: bool = True) -> None:
        self.sink = sink or DisplaySink()
        self.interval = interval
        self.refresh = max(refresh, interval)
        self.idle = idle
        self.clock = clock
        self.segmenter = Segmenter(max_tail=max_tail)
        self.live: str | None = None          # display id of the live output
        self.live_shown: Output = {}          # what the live output shows now
        self.shown_tail = 0                   # raw tail characters the live output shows (0: indicator/none)
        self.indicator = INDICATOR
        self.last_update = float("-inf")
        self.dirty = False
        self.updates = 0                      # number of outputs sent (shows + updates), for tests/benchmarks
        self.answer: list[str] = []           # the plain answer (raw model text), for the caller
        self.pending: list[str] = []          # finished blocks (raw text) not yet sent
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._idle_timer: asyncio.TimerHandle | None = None
        self._schedule = schedule
        self._streaming = not isinstance(self.sink, TextSink)

    # ------------------------------------------------------------------ text
    def text(self, delta: str) -> None:
        """Add streamed model text."""
        if not delta:
            return
        self.answer.append(delta)
        if not self._streaming:
            # a terminal: escape sequences and bidi overrides in model text are shown, not obeyed
            self._print_raw(visible(delta, strict=False))
            return
        self._cancel_idle()
        # finished blocks wait for the next allowed update and go out together as one output, so a fast
        # stream of short paragraphs still sends at most ~2 messages per interval
        self.pending.extend(self.segmenter.feed(delta))
        self.dirty = True
        self._maybe_flush()

    def _print_raw(self, delta: str) -> None:
        stream = getattr(self.sink, "stream", sys.stdout)
        stream.write(delta)
        stream.flush()

    def status(self, indicator: str) -> None:
        """Change the working indicator (shown at once when the live output shows the indicator)."""
        if not self._streaming:
            return
        self.indicator = indicator
        if self.shown_tail == 0 and not self.segmenter.tail.strip():
            self.dirty = True
            self._maybe_flush(force=True)

    # ------------------------------------------------------------------ plumbing
    def _render_live(self) -> Output:
        tail = self.segmenter.tail
        if tail.strip():
            # the open block as plain text: never parsed as Markdown nor sent as HTML, so a half-written
            # link or fence cannot change how it renders; bounded by max_tail
            return {"text/plain": visible(tail, strict=False) + CURSOR}
        return _own(self.indicator) if self.live is not None else {}

    def _send_live(self, output: Output) -> None:
        if output == self.live_shown and self.live is not None:
            return
        if not output and self.live is None:
            return
        if self.live is None:
            # 64 random bits name a display uniquely within a notebook; a short id is resent with every update
            self.live = f"relay-{uuid.uuid4().hex[:16]}"
            self.sink.show(output, self.live)
        else:
            self.sink.update(output, self.live)
        self.live_shown = output
        self.updates += 1

    def _freeze(self, blocks: list[str]) -> None:
        """Write finished blocks, each rendered once: as the last update of the live display, else as a
        new output."""
        output = {"text/html": "".join(markdown_html(block) for block in blocks),
                  "text/plain": "\n\n".join(visible(block, strict=False) for block in blocks)}
        if self.live is not None:
            self.sink.update(output, self.live)
            self.live = None
            self.live_shown = {}
        else:
            self.sink.show(output, None)
        self.shown_tail = 0
        self.updates += 1
        self.last_update = self.clock()

    def _due(self) -> float:
        """When the next update may go out (-inf: now)."""
        if (not self.pending and self.live is not None and self.shown_tail == 0
                and self.segmenter.tail.strip()):
            # the live display shows only the indicator: the first text replaces it at once (rule 2; one
            # message per indicator shown). Waiting for the interval counted from the indicator delayed a
            # fresh kernel's first text by up to 0.1 s (issue 18, measured in benchmarks/peer_magics.py)
            return float("-inf")
        if self.pending or (self.live is not None and self.shown_tail == 0):
            return self.last_update + self.interval   # a finished block, or the first text after the indicator
        # a partial view is interim output: only when the paragraph showed nothing new for `refresh`
        return self.last_update + self.refresh

    def _maybe_flush(self, force: bool = False) -> None:
        if not self.dirty:
            return
        due = self._due()
        if force or self.clock() >= due:
            self.flush(force)
        elif self._schedule and due < self._timer_at:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            if self._timer is not None:
                self._timer.cancel()
            # the stream may pause (a slow model); make sure the last delta still shows in time
            self._timer = loop.call_later(max(due - self.clock(), 0.0), self._on_timer)
            self._timer_at = due

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        self.flush()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, float("inf")

    def _cancel_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _arm_idle(self) -> None:
        """After a block ends the stream with nothing growing, show the indicator if the stream stays quiet."""
        if not self._schedule or self.live is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._cancel_idle()
        self._idle_timer = loop.call_later(self.idle, self._on_idle)

    def _on_idle(self) -> None:
        self._idle_timer = None
        if self.live is None and not self.segmenter.tail.strip() and not self.pending:
            self._send_live(_own(self.indicator))
            self.last_update = self.clock()

    def flush(self, force: bool = False) -> None:
        """Send what is waiting: finished blocks now, the growing tail when its rule allows (or ``force``)."""
        self._cancel_timer()
        if not self.dirty:
            return
        self._flush_pending()
        if not force and self.clock() < self._due():
            # the blocks went out; the new paragraph's first text waits until it is worth a message
            self._maybe_flush()
            return
        self.dirty = False
        self.last_update = self.clock()
        self._send_live(self._render_live())
        self.shown_tail = len(self.segmenter.tail) if self.segmenter.tail.strip() else 0
        if self.live is None:
            self._arm_idle()

    def _flush_pending(self) -> None:
        if self.pending:
            self._freeze(list(self.pending))
            self.pending.clear()

    # ------------------------------------------------------------------ structure
    def pause(self) -> None:
        """Freeze the current tail so a card or a tool step can appear below it in order."""
        if not self._streaming:
            return
        self._cancel_idle()
        rest = self.segmenter.finish()
        if rest.strip():
            self.pending.append(rest)
        if self.pending:
            self._flush_pending()
        elif self.live is not None:
            # only an indicator was showing: clear it, the next text opens a new live output below
            self.sink.update({}, self.live)
            self.live, self.live_shown = None, {}
            self.updates += 1
        self._cancel_timer()
        self.shown_tail = 0
        self.dirty = False

    def resume(self, indicator: str = INDICATOR) -> None:
        """Show the working indicator again below whatever was displayed last."""
        if not self._streaming:
            return
        self._cancel_idle()
        self.indicator = indicator
        if self.live is None and not self.segmenter.tail.strip() and not self.pending:
            self._send_live(_own(indicator))
            self.last_update = self.clock()
            return
        self.dirty = True
        self._maybe_flush(force=True)

    def finish(self, footer: str = "", *, metadata: dict[str, Any] | None = None) -> str:
        """Freeze the rest of the answer, replace the indicator with ``footer``; return the answer text.
        ``metadata`` goes with the footer's output (the answer's provenance: docs/provenance.md)."""
        self._cancel_timer()
        self._cancel_idle()
        if self._streaming:
            rest = self.segmenter.finish()
            if rest.strip():
                self.pending.append(rest)
            self._flush_pending()
            if self.live is not None:
                _with_metadata(self.sink.update, _own(footer) if footer else {}, self.live, metadata=metadata)
                self.live = None
                self.updates += 1
            elif footer:
                _with_metadata(self.sink.show, _own(footer), None, metadata=metadata)
                self.updates += 1
        elif footer:
            self._print_raw(("\n" if self.answer else "") + footer + "\n")
        self.dirty = False
        return "".join(self.answer)
