"""Streaming an answer into cell outputs with bounded, linear iopub traffic.

Layout of a cell's outputs while a run streams::

    [finished block 1]   text/markdown, sent once (a frozen display)
    [finished block 2]
    [card / tool step]   widgets, shown between blocks
    [live display]       the unfinished tail + a working indicator, updated <= 1/interval per second

A finished block is written into the live display once (so outputs stay in order) and a new
live display is opened lazily below it; a finished block is never resent. The tail is bounded by
the :class:`~relay_jupyter.kernel.markdown.Segmenter`, so every update is bounded too. At the end
the answer stays as plain ``text/markdown`` outputs: a saved notebook reads well without widgets.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from .markdown import Segmenter, escape_markdown

__all__ = ["DisplaySink", "Sink", "StreamView", "TextSink"]

INDICATOR = "⏳ *working…*"


class Sink(Protocol):
    """Where the view writes. ``show`` opens a new output (optionally updatable); ``update`` replaces one."""

    def show(self, markdown: str, display_id: str | None) -> None: ...
    def update(self, markdown: str, display_id: str) -> None: ...


class DisplaySink:
    """IPython rich display: ``text/markdown`` outputs, updated by display id."""

    def show(self, markdown: str, display_id: str | None) -> None:
        from IPython.display import display

        display({"text/markdown": markdown}, raw=True, display_id=display_id)

    def update(self, markdown: str, display_id: str) -> None:
        from IPython.display import update_display

        update_display({"text/markdown": markdown}, raw=True, display_id=display_id)


class TextSink:
    """A terminal: text is printed as it arrives (no updates there, so no coalescing is needed)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout

    def show(self, markdown: str, display_id: str | None) -> None:
        if display_id is None and markdown:
            self.stream.write(markdown + "\n")
            self.stream.flush()

    def update(self, markdown: str, display_id: str) -> None:
        return None


class StreamView:
    """Renders one run's text. Feed deltas with :meth:`text`; call :meth:`pause` before showing a card
    or tool step, :meth:`status` to change the indicator and :meth:`finish` at the end."""

    def __init__(self, sink: Sink | None = None, *, interval: float = 0.1, max_tail: int = 1200,
                 clock: Callable[[], float] = time.monotonic, schedule: bool = True) -> None:
        self.sink = sink or DisplaySink()
        self.interval = interval
        self.clock = clock
        self.segmenter = Segmenter(max_tail=max_tail)
        self.live: str | None = None          # display id of the live output
        self.live_shown = ""                  # what the live output shows now
        self.indicator = INDICATOR
        self.last_update = float("-inf")
        self.dirty = False
        self.updates = 0                      # number of outputs sent (shows + updates), for tests/benchmarks
        self.answer: list[str] = []           # the plain answer (raw model text), for the caller
        self.pending: list[str] = []          # finished, escaped blocks not yet sent
        self._timer: asyncio.TimerHandle | None = None
        self._schedule = schedule
        self._streaming = not isinstance(self.sink, TextSink)

    # ------------------------------------------------------------------ text
    def text(self, delta: str) -> None:
        """Add streamed model text."""
        if not delta:
            return
        self.answer.append(delta)
        if not self._streaming:
            self._print_raw(delta)
            return
        # finished blocks wait for the next flush and go out together as one output, so a fast
        # stream of short paragraphs still sends at most ~2 messages per interval
        self.pending.extend(escape_markdown(block) for block in self.segmenter.feed(delta))
        self.dirty = True
        self._maybe_flush()

    def _print_raw(self, delta: str) -> None:
        stream = getattr(self.sink, "stream", sys.stdout)
        stream.write(delta)
        stream.flush()

    def status(self, indicator: str) -> None:
        """Change the working indicator (e.g. while waiting for a click)."""
        if not self._streaming:
            return
        self.indicator = indicator
        self.dirty = True
        self._maybe_flush(force=True)

    # ------------------------------------------------------------------ plumbing
    def _render_live(self) -> str:
        tail = escape_markdown(self.segmenter.tail)
        if tail.strip():
            return f"{tail}▍\n\n{self.indicator}" if self.indicator else tail
        return self.indicator

    def _send_live(self, markdown: str) -> None:
        if markdown == self.live_shown and self.live is not None:
            return
        if self.live is None:
            self.live = f"relay-{uuid.uuid4().hex}"
            self.sink.show(markdown, self.live)
        else:
            self.sink.update(markdown, self.live)
        self.live_shown = markdown
        self.updates += 1

    def _freeze(self, markdown: str) -> None:
        """Write a finished block: into the live display (once), else as a new output."""
        if self.live is not None:
            self.sink.update(markdown, self.live)
            self.live = None
            self.live_shown = ""
        else:
            self.sink.show(markdown, None)
        self.updates += 1
        self.last_update = self.clock()

    def _maybe_flush(self, force: bool = False) -> None:
        if not self.dirty:
            return
        now = self.clock()
        wait = self.last_update + self.interval - now
        if force or wait <= 0:
            self.flush()
        elif self._schedule and self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            # the stream may pause (a slow model); make sure the last delta still shows
            self._timer = loop.call_later(wait, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Send the live tail now if it changed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.dirty:
            return
        self.dirty = False
        self._flush_pending()
        self.last_update = self.clock()
        self._send_live(self._render_live())

    def _flush_pending(self) -> None:
        if self.pending:
            self._freeze("\n\n".join(self.pending))
            self.pending.clear()

    # ------------------------------------------------------------------ structure
    def pause(self) -> None:
        """Freeze the current tail so a card or a tool step can appear below it in order."""
        if not self._streaming:
            return
        rest = self.segmenter.finish()
        if rest.strip():
            self.pending.append(escape_markdown(rest))
        if self.pending:
            self._flush_pending()
        elif self.live is not None:
            # only an indicator was showing: clear it, the next text opens a new live output below
            self.sink.update("", self.live)
            self.live, self.live_shown = None, ""
            self.updates += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.dirty = False

    def resume(self, indicator: str = INDICATOR) -> None:
        """Show the working indicator again below whatever was displayed last."""
        if not self._streaming:
            return
        self.indicator = indicator
        self.dirty = True
        self._maybe_flush(force=True)

    def finish(self, footer: str = "") -> str:
        """Freeze the rest of the answer, replace the indicator with ``footer``; return the answer text."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._streaming:
            rest = self.segmenter.finish()
            if rest.strip():
                self.pending.append(escape_markdown(rest))
            self._flush_pending()
            if self.live is not None:
                self.sink.update(footer, self.live)
                self.live = None
                self.updates += 1
            elif footer:
                self.sink.show(footer, None)
                self.updates += 1
        elif footer:
            self._print_raw(("\n" if self.answer else "") + footer + "\n")
        self.dirty = False
        return "".join(self.answer)
