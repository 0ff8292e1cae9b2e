"""Make model text safe to show as a Markdown output, and cut a stream into finished blocks.

Kernel outputs of the running session are *trusted* by JupyterLab, which then renders the HTML a
Markdown renderer produces without sanitising it (and runs ``<script>`` tags). Model text is
attacker-controlled (prompt injection), so before it becomes ``text/markdown`` we neutralise, outside
code (fenced blocks and inline code spans, which renderers show literally):

- every ``<`` and ``&`` -> ``&lt;`` / ``&amp;``: no raw HTML, no autolinks, no entity tricks;
- links whose destination scheme is not http(s)/mailto (``javascript:``, ``data:``, ``vbscript:`` ...,
  also with whitespace or case tricks) -> the ``](`` is escaped so the text shows and nothing links;
- images -> shown as text (a remote image is a data-exfiltration channel: it loads by itself);
- reference definitions with an unsafe destination -> shown as text.

Hand-written (not markdown-it + a sanitiser) because the output must stay *Markdown*: a saved
notebook keeps the answer as ``text/markdown``, readable without the kernel.
"""

from __future__ import annotations

import re

__all__ = ["Segmenter", "escape_markdown"]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_SAFE_SCHEMES = ("http", "https", "mailto")
_SCHEME = re.compile(r"^([a-z][a-z0-9+.\-]*):")
_WS_CTRL = re.compile(r"[\x00-\x20\x7f]+")
_REF_DEF = re.compile(r"^( {0,3})\[([^\]]*)\]:(.*)$")


def _unsafe_destination(dest: str) -> bool:
    # browsers drop ASCII whitespace/control characters inside URLs ("java\tscript:"), and schemes are
    # case-insensitive, so normalise both before looking at the scheme; a backslash escape is also dropped
    flat = _WS_CTRL.sub("", dest).replace("\\", "").lower().lstrip("<")
    match = _SCHEME.match(flat)
    return bool(match) and match.group(1) not in _SAFE_SCHEMES


def _escape_prose(text: str) -> str:
    """Escape one stretch of prose (no code inside)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    # images: "![" -> "!\[" so the renderer shows the text instead of loading the URL
    text = text.replace("![", "!\\[")
    # inline links: look at every "](" and its destination up to ")" (or the end)
    out: list[str] = []
    pos = 0
    while (idx := text.find("](", pos)) != -1:
        close = text.find(")", idx + 2)
        dest = text[idx + 2: close if close != -1 else len(text)]
        out.append(text[pos:idx])
        out.append("]\\(" if _unsafe_destination(dest) else "](")
        pos = idx + 2
    out.append(text[pos:])
    return "".join(out)


def _escape_inline(line_block: str) -> str:
    """Escape a block of non-fenced lines, keeping inline code spans verbatim (CommonMark matching)."""
    out: list[str] = []
    i = 0
    prose_start = 0
    n = len(line_block)
    while i < n:
        ch = line_block[i]
        if ch == "\\" and i + 1 < n:
            i += 2  # an escaped character (including an escaped backtick) never opens a code span
            continue
        if ch != "`":
            i += 1
            continue
        run_end = i
        while run_end < n and line_block[run_end] == "`":
            run_end += 1
        run = run_end - i
        # the closing run must have exactly the same length
        search = run_end
        close = -1
        while (found := line_block.find("`" * run, search)) != -1:
            end = found + run
            if (end < n and line_block[end] == "`") or line_block[found - 1] == "`":
                search = end
                while search < n and line_block[search] == "`":
                    search += 1
                continue
            close = found
            break
        if close == -1:
            i = run_end  # an unmatched run is literal backticks; keep scanning as prose
            continue
        out.append(_escape_prose(line_block[prose_start:i]))
        out.append(line_block[i: close + run])
        i = prose_start = close + run
    out.append(_escape_prose(line_block[prose_start:]))
    return "".join(out)


def _escape_ref_defs(block: str) -> str:
    lines = block.split("\n")
    for k, line in enumerate(lines):
        match = _REF_DEF.match(line)
        if match and _unsafe_destination(match.group(3).strip()):
            lines[k] = f"{match.group(1)}\\[{match.group(2)}]:{match.group(3)}"
    return "\n".join(lines)


def escape_markdown(text: str) -> str:
    """Model text -> Markdown with raw HTML, unsafe links and images neutralised (code kept verbatim)."""
    out: list[str] = []
    prose: list[str] = []
    fence: tuple[str, int] | None = None

    def flush_prose() -> None:
        if prose:
            out.append(_escape_inline(_escape_ref_defs("\n".join(prose))))
            prose.clear()

    for line in text.split("\n"):
        match = _FENCE.match(line)
        if fence is None:
            if match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
                flush_prose()
                fence = (match.group(1)[0], len(match.group(1)))
                out.append(line)
            else:
                prose.append(line)
        else:
            out.append(line)
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= fence[1] \
                    and not match.group(2).strip():
                fence = None
    flush_prose()
    return "\n".join(out)


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
