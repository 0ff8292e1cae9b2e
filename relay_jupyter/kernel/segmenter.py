"""Cut a stream of model text into finished blocks and an unfinished tail (pure, no rendering).

The blocks are rendered once each by :mod:`relay_jupyter.kernel.rendering`; the tail is shown as
escaped text while it grows (``render.py``). Fence detection here only decides where a block ends
(a blank line inside a code fence does not end it); it plays no part in safety.
"""

from __future__ import annotations

import re

__all__ = ["Segmenter"]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


class Segmenter:
    """A pure accumulator that cuts streamed text into finished blocks and an unfinished tail.

    A block is finished at a blank line outside a code fence, or after a fence closes. The tail is
    kept at most ``max_tail`` characters: beyond that it is cut at a line break (closing and
    reopening an open fence), a sentence end in the window's second half, or a space, so each live update of the tail is bounded and the bytes
    sent stay linear in the answer. Work per ``feed`` is bounded by the new text plus ``max_tail``.
    """

    def __init__(self, max_tail: int = 1200) -> None:
        self.max_tail = max_tail
        self.tail = ""
        self._scan = 0            # index in tail up to which complete lines were scanned
        self._fence: tuple[str, int, str] | None = None   # (char, length, opener line) at _scan
        self._fence_at_start: tuple[str, int, str] | None = None  # fence state at tail[0]

    def _update_fence(self, line: str, fence: tuple[str, int, str] | None) -> tuple[str, int, str] | None:
        match = _FENCE.match(line)
        if fence is None:
            if match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
                return (match.group(1)[0], len(match.group(1)), line)
            return None
        if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= fence[1] \
                and not match.group(2).strip():
            return None
        return fence

    def feed(self, text: str) -> list[str]:
        """Add streamed text; return the blocks it finished (each once, in order)."""
        self.tail += text
        done: list[str] = []
        while (nl := self.tail.find("\n", self._scan)) != -1:
            line = self.tail[self._scan:nl]
            before = self._fence
            self._fence = self._update_fence(line, before)
            self._scan = nl + 1
            closed_fence = before is not None and self._fence is None
            blank_boundary = before is None and not line.strip() and self.tail[:nl].strip()
            if closed_fence or blank_boundary:
                block = self.tail[: self._scan].strip("\n")
                self.tail = self.tail[self._scan:]
                self._scan = 0
                self._fence_at_start = None
                if block.strip():
                    done.append(block)
        if len(self.tail) > self.max_tail:
            done.append(self._cut())
        return done

    def _cut(self) -> str:
        limit = self.max_tail
        nl = self.tail.rfind("\n", 0, min(limit, self._scan))
        if nl > 0:
            cut, skip = nl, 1
        else:
            # prefer a sentence end in the second half of the window: the cut shows as a paragraph break
            sentence = max(self.tail.rfind(end, limit // 2, limit) for end in (". ", "! ", "? "))
            sp = sentence + 1 if sentence > 0 else self.tail.rfind(" ", 0, limit)
            cut, skip = (sp, 1) if sp > 0 else (limit, 0)
        head, rest = self.tail[:cut], self.tail[cut + skip:]
        # the fence state at the cut: rescan the head's complete lines (bounded by max_tail); a tail that
        # starts with a reopened fence starts in that fence, so its opener line is not scanned again
        fence = self._fence_at_start
        lines = head.split("\n") if nl > 0 else []
        if fence is not None and lines:
            lines = lines[1:]
        for line in lines:
            fence = self._update_fence(line, fence)
        if fence is not None:
            head = f"{head}\n{fence[0] * fence[1]}"
            rest = f"{fence[2]}\n{rest}"
        self.tail = rest
        self._fence_at_start = fence
        # rescan the new tail from the start (bounded)
        self._scan = 0
        self._fence = fence
        if fence is not None:
            self._scan = len(fence[2]) + 1
        return head

    def finish(self) -> str:
        """The remaining tail as a last block ('' when empty); the segmenter is reset."""
        rest = self.tail.strip("\n")
        self.tail, self._scan, self._fence, self._fence_at_start = "", 0, None, None
        return rest
