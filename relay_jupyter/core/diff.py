"""Unified diffs that are byte-identical to GNU ``diff -u`` and apply with ``patch -p1``.

Why hand-written rather than :mod:`difflib`: ``difflib.unified_diff`` picks different alignments than
GNU diff, omits ``\\ No newline at end of file``, splits lines on a lone CR, and is quadratic on
scattered edits over a large file. This module reimplements the *algorithm* GNU diff uses (Myers'
O(ND) middle-snake search with the "too expensive" cut-off, the "confusing lines" discard pass and
the boundary-shifting canonicalisation) so that the hunks come out the same, byte for byte.

Lines are split on ``\\n`` only, like GNU diff: a lone CR is part of its line and a CRLF line ends in
``\\r\\n``. A final line without a newline is a different line from the same text with one.

:func:`unified_diff` (the push card, ``workspace.diff``, ``relay.diff`` in a kernel) finds the identical
head and tail on bytes. On a large file it then follows equal bytes and resynchronises after each
difference (:func:`_resync_spans`: ``bytes.find`` of the next lines, no line split or hashed) and hands
the spans found to the windowed diff below, taking its result only when that is provably GNU's. With
many changes (a ``replace_all``) the middle is split once and its lines compared at C speed
(:func:`_many_changes`), the result again taken only when provably GNU's; in every other case (small
files, anything unproven) the middle is split into lines and analysed exactly as GNU does, with the
per-line passes at C speed (see :mod:`.diff_analysis`).
``benchmarks/bench_diff.py`` measures both against GNU.

For an edit whose spans are known, large files are never diffed whole: :func:`unified_diff_spans` takes the byte spans an edit replaced
and diffs only the windows around them (GNU's own "identical prefix and suffix" trimming, done per
window). When all changes fall within one window the result is exactly GNU's; with several distant
windows each is analysed like its own GNU run. Files under :data:`EXACT_LIMIT` are analysed whole, so
their diffs are exactly GNU's. Above it, the hunks are GNU's except where GNU's tie-breaking between
equally short diffs depends on lines far outside the edited windows (its "confusing lines" pass
counts repeats over the whole region between the first and last change); the diff is then still a
minimal, correct one that ``patch`` applies.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, compress, repeat
from operator import add, eq, ge, gt, lt, ne, or_, sub

from .diff_analysis import Change, WorkExceeded, analyze, changes_of
from .gnudiff_gate import cost_bound_ok, crossing_blocks_cancel, crossing_runs_cancel

__all__ = [
    "CONTEXT",
    "DENSE_SPANS",
    "EXACT_LIMIT",
    "EXACT_STEPS",
    "EXACT_WORK",
    "Change",
    "DiffResult",
    "WorkExceeded",
    "split_lines",
    "unified_diff",
    "unified_diff_spans",
]

#: Below this many bytes (old + new) a windowed diff is analysed whole, which is exactly GNU's result.
EXACT_LIMIT = 512 * 1024
#: Lines of context around each hunk, as ``diff -u``.
CONTEXT = 3
# GNU keeps this many identical lines on each side of the differing region ("horizon lines").
_HORIZON = CONTEXT
_NO_NEWLINE = b"\n\\ No newline at end of file\n"


@dataclass(frozen=True)
class DiffResult:
    """A unified diff and where it starts."""

    text: bytes
    """The diff, byte-identical to ``diff -u --label a/P --label b/P old new`` (empty when identical)."""
    first_changed_line: int | None
    """1-based line number in the NEW file of the first changed line (or of the line after a pure
    deletion, clamped to the file); None when nothing changed."""
    hunks: int
    """Number of ``@@`` hunks."""


def split_lines(data: bytes) -> list[bytes]:
    """Split on ``\\n`` keeping the terminator; a last line without one is kept as is."""
    if not data:
        return []
    lines = data.split(b"\n")
    last = lines.pop()
    out = [line + b"\n" for line in lines]
    if last:
        out.append(last)
    return out


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _range(a: int, b: int) -> bytes:
    """GNU's unified range for 0-based inclusive lines [a, b]; b < a is an empty range."""
    ta, tb = a + 1, b + 1
    if tb <= ta:
        return b"%d,0" % tb if tb < ta else b"%d" % tb
    return b"%d,%d" % (ta, tb - ta + 1)


def _emit(prefix: bytes, line: bytes) -> bytes:
    """One diff line; a line without its newline gets GNU's ``\\ No newline at end of file``."""
    return prefix + line if line[-1:] == b"\n" else prefix + line + _NO_NEWLINE


def _block(prefix: bytes, block: bytes) -> bytes:
    """Whole lines ``block`` with ``prefix`` before each (at C speed); GNU's marker after a last line."""
    if not block:
        return b""
    if block[-1:] == b"\n":
        return prefix + block[:-1].replace(b"\n", b"\n" + prefix) + b"\n"
    return prefix + block.replace(b"\n", b"\n" + prefix) + _NO_NEWLINE


def _format(changes: list[Change], old_line, new_line, n0: int, n1: int,
            old_label: str, new_label: str, old_block=None) -> DiffResult:
    """Group changes into hunks (gap < 2*CONTEXT+1 joins) and print them like GNU ``diff -u``."""
    if not changes:
        return DiffResult(b"", None, 0)
    out = [b"--- ", old_label.encode(), b"\n+++ ", new_label.encode(), b"\n"]
    add = out.append
    thresh = 2 * CONTEXT + 1
    hunks = 0
    k = 0
    nch = len(changes)
    while k < nch:
        first = k
        while k + 1 < nch and changes[k + 1].line0 - (changes[k].line0 + changes[k].deleted) < thresh:
            k += 1
        last = k
        k += 1
        hunks += 1
        h0, hl = changes[first], changes[last]
        first0 = max(h0.line0 - CONTEXT, 0)
        first1 = max(h0.line1 - CONTEXT, 0)
        last0 = min(hl.line0 + hl.deleted - 1 + CONTEXT, n0 - 1)
        last1 = min(hl.line1 + hl.inserted - 1 + CONTEXT, n1 - 1)
        add(b"@@ -" + _range(first0, last0) + b" +" + _range(first1, last1) + b" @@\n")
        i, j = first0, first1
        if old_block is not None:
            # Whole runs of lines as byte blocks: the fast path for diffs with many hunks.
            for idx in range(first, last + 1):
                ch = changes[idx]
                if i < ch.line0:
                    add(_block(b" ", old_block(i, ch.line0)))
                    j += ch.line0 - i
                    i = ch.line0
                if ch.deleted:
                    add(_block(b"-", old_block(i, i + ch.deleted)))
                    i += ch.deleted
                if ch.inserted:
                    add(_block(b"+", b"".join([new_line(x) for x in range(j, j + ch.inserted)])))
                    j += ch.inserted
            if i <= last0:
                add(_block(b" ", old_block(i, last0 + 1)))
            continue
        for idx in range(first, last + 1):
            ch = changes[idx]
            while i < ch.line0:
                add(_emit(b" ", old_line(i)))
                i += 1
                j += 1
            for _ in range(ch.deleted):
                add(_emit(b"-", old_line(i)))
                i += 1
            for _ in range(ch.inserted):
                add(_emit(b"+", new_line(j)))
                j += 1
        while i <= last0:
            add(_emit(b" ", old_line(i)))
            i += 1
            j += 1
    c = changes[0]
    first_line = c.line1 + 1 if c.inserted else min(c.line1 + 1, max(n1, 1))
    return DiffResult(b"".join(out), first_line, hunks)


def unified_diff(old: bytes, new: bytes, *, old_label: str = "a", new_label: str = "b",
                 budget: int | None = None) -> DiffResult:
    """Diff two whole byte strings. Same output as ``diff -u --label``, for files of any size.

    The identical head and tail are found on bytes (slices compared at C speed) and only the middle,
    with GNU's horizon lines, is split into lines; those are analysed as GNU does (``analyze``).

    Raises:
        WorkExceeded: only with a ``budget``, when the exact search would exceed it.
    """
    if old == new:
        return DiffResult(b"", None, 0)
    pre_end, xa, xb = _middle(old, new)
    if budget is None and len(old) + len(new) > EXACT_LIMIT:
        # A large file: find the changes by following equal bytes and resynchronising after each
        # difference (no line is split or hashed), and let the windowed diff prove that its result is
        # GNU's; with many changes, the lines are compared at C speed instead (_many_changes, which
        # proves its result the same way); anything unproven is analysed exactly below.
        spans = _resync_spans(old, new, pre_end, xa, pre_end, xb)
        if spans:
            result = unified_diff_spans(old, new, spans, old_label=old_label, new_label=new_label,
                                        proven_only=True)
            if result is not None:
                return result
        elif spans is None:
            result = _many_changes(old, new, pre_end, xa, xb, old_label, new_label)
            if result is not None:
                return result
    # GNU keeps _HORIZON identical lines on each side of the differing middle
    lo = pre_end
    for _ in range(_HORIZON):
        if lo == 0:
            break
        lo = old.rfind(b"\n", 0, lo - 1) + 1
    hi0 = xa
    for _ in range(_HORIZON):
        if hi0 >= len(old):
            break
        hi0 = _line_end(old, hi0)
    hi1 = xb + (hi0 - xa)
    # A run slid into the horizon lines has its context beyond them: CONTEXT more lines each side are
    # split too (for the output only).
    out_lo, out_hi0 = _extend(old, lo, hi0, CONTEXT)
    out_hi1 = hi1 + (out_hi0 - hi0)
    a, b = _split(old[out_lo:out_hi0]), _split(new[out_lo:out_hi1])
    base = old.count(b"\n", 0, out_lo)
    skip = old.count(b"\n", out_lo, lo)
    tail0, tail1 = old.count(b"\n", hi0, out_hi0), new.count(b"\n", hi1, out_hi1)
    if out_hi0 == len(old) and old and not old.endswith(b"\n") and hi0 < out_hi0:
        tail0 += 1
    if out_hi1 == len(new) and new and not new.endswith(b"\n") and hi1 < out_hi1:
        tail1 += 1
    ra, rb = a[skip:len(a) - tail0], b[skip:len(b) - tail1]
    ch0, ch1 = analyze(ra, rb, len(ra), len(rb), None if budget is None else [budget])
    changes = changes_of(ch0, ch1, base + skip, base + skip)
    n0, n1 = _count_lines(old), _count_lines(new)

    def line_of(lines: list[bytes]):
        def line(i: int) -> bytes:
            text = lines[i - base]
            return text[:-1] if text[-1:] == _NO_EOL else text + b"\n"
        return line

    def old_block(i: int, j: int) -> bytes:
        run = a[i - base:j - base]
        text = b"\n".join(run)
        return text[:-1] if run[-1][-1:] == _NO_EOL else text + b"\n"

    return _format(changes, line_of(a), line_of(b), n0, n1, old_label, new_label, old_block=old_block)


def _middle(old: bytes, new: bytes) -> tuple[int, int, int]:
    """The differing middle at line boundaries: ``old[pre_end:xa]`` became ``new[pre_end:xb]``."""
    # Whole identical lines at the start; then at the end, not reaching back into them.
    pre_end = old.rfind(b"\n", 0, _common_prefix(old, new)) + 1
    xa = len(old) - _common_suffix(old, new, min(len(old), len(new)) - pre_end)
    xb = xa + len(new) - len(old)
    if not (_line_starts(old, xa, pre_end) and _line_starts(new, xb, pre_end)):
        # inside the common tail newlines are at the same places in both files: the next one
        k = old.find(b"\n", xa)
        xa = len(old) if k < 0 else k + 1
        xb = xa + len(new) - len(old)
    return pre_end, xa, xb


#: Marks the last line of a file that has no newline (:func:`_split` appends it): no other line of
#: the split contains one, so the line stays different from the same text with a newline.
_NO_EOL = b"\n"
_CHUNK = 1 << 16


def _split(chunk: bytes) -> list[bytes]:
    """Lines of a chunk that ends at a line boundary or at the end of the file, without their newline
    (one C-speed ``split``); a last line without a newline ends in :data:`_NO_EOL`."""
    lines = chunk.split(b"\n")
    last = lines.pop()
    if last:
        lines.append(last + _NO_EOL)
    return lines


#: Resynchronisation (:func:`_resync_spans`): after a difference, the next place where this many
#: whole lines are equal in both files, looked for among the next _SYNC_PROBES lines of each file
#: within _SYNC_AHEAD bytes of the other; more than _SYNC_SPANS changes and the exact analysis runs.
_SYNC_RUN = 8
_SYNC_PROBES = 32
_SYNC_AHEAD = 256 * 1024
_SYNC_SPANS = 64


def _run_length(a: bytes, i: int, a_end: int, b: bytes, j: int, b_end: int) -> int:
    """How many bytes of ``a[i:a_end]`` and ``b[j:b_end]`` are equal from the start (slices compared
    at C speed, doubling, then a bisection)."""
    n = min(a_end - i, b_end - j)
    k, step = 0, 256
    while k < n:
        m = min(step, n - k)
        if a[i + k:i + k + m] == b[j + k:j + k + m]:
            k += m
            step = min(step << 1, _CHUNK)
            continue
        lo, hi = k, k + m
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if a[i + lo:i + mid] == b[j + lo:j + mid]:
                lo = mid
            else:
                hi = mid
        return lo
    return k


def _resync_spans(old: bytes, new: bytes, a0: int, a_end: int, b0: int, b_end: int
                  ) -> list[tuple[int, int, int]] | None:
    """Byte spans ``(start, end, new_length)`` of ``old`` that turn ``old[a0:a_end]`` into
    ``new[b0:b_end]`` (all four at line starts): equal stretches are followed at C speed and, after a
    difference, the nearest place where _SYNC_RUN equal lines follow is searched with ``bytes.find``.
    None when that is not found quickly (many or long changes): the caller then analyses the region
    whole. Any spans returned are correct; the windowed diff re-analyses the lines around them.
    """
    spans: list[tuple[int, int, int]] = []
    pa, pb = a0, b0
    while True:
        k = _run_length(old, pa, a_end, new, pb, b_end)
        if pa + k == a_end and pb + k == b_end:
            return spans
        cut = old.rfind(b"\n", pa, pa + k) + 1  # whole equal lines only
        if cut > pa:
            pb += cut - pa
            pa = cut
        if len(spans) == _SYNC_SPANS:
            return None
        if pa == a_end or pb == b_end:
            spans.append((pa, a_end, b_end - pb))
            return spans
        found = _sync_point(old, new, pa, a_end, pb, b_end)
        if found is None:
            return None
        x, y = found
        spans.append((pa, x, y - pb))
        pa, pb = x, y


def _next_lines(data: bytes, pos: int, end: int, n: int) -> int:
    """Position after ``n`` more lines from line start ``pos`` (at most ``end``)."""
    for _ in range(n):
        if pos >= end:
            return end
        k = data.find(b"\n", pos, end)
        pos = end if k < 0 else k + 1
    return pos


def _sync_point(old: bytes, new: bytes, pa: int, a_end: int, pb: int, b_end: int) -> tuple[int, int] | None:
    """The nearest (by bytes skipped in both files) line starts (x, y) from which _SYNC_RUN lines of
    ``old`` and ``new`` are equal, or the rest of both is; None if none among the probed lines."""
    best: tuple[int, int] | None = None
    cost = 1 << 62
    if a_end - pa <= _SYNC_AHEAD and b_end - pb <= _SYNC_AHEAD:
        best, cost = (a_end, b_end), (a_end - pa) + (b_end - pb)  # the rest of both is one change
    # First the likeliest answer, one line replaced by one line: found, it bounds every search below
    # (a probe whose anchor holds the changed line would otherwise scan _SYNC_AHEAD bytes in vain).
    x1, y1 = _line_end(old, pa), _line_end(new, pb)
    if x1 < a_end and y1 < b_end:
        e = _next_lines(old, x1, a_end, _SYNC_RUN)
        if (new.startswith(old[x1:e], y1) if e < a_end else new[y1:b_end] == old[x1:e]) \
                and (x1 - pa) + (y1 - pb) < cost:
            best, cost = (x1, y1), (x1 - pa) + (y1 - pb)
    for src, s0, s_end, dst, d0, d_end, flip in ((old, pa, a_end, new, pb, b_end, False),
                                                 (new, pb, b_end, old, pa, a_end, True)):
        x = s0
        for _ in range(_SYNC_PROBES):
            if x >= s_end or x - s0 >= cost:
                break
            e = _next_lines(src, x, s_end, _SYNC_RUN)
            anchor = src[x:e]
            if e == s_end:
                # fewer than _SYNC_RUN lines left: they must be the rest of the other file too
                y = d_end - len(anchor)
                ok = y >= d0 and (y == d0 or dst[y - 1:y] == b"\n") and dst[y:d_end] == anchor
                candidates = [y] if ok else []
            else:
                candidates = []
                # only a start nearer than the best so far can win
                stop = min(d_end, d0 + min(_SYNC_AHEAD, cost - (x - s0)) + len(anchor))
                y = dst.find(anchor, d0, stop)
                while y >= 0:
                    if y == d0 or dst[y - 1:y] == b"\n":
                        candidates.append(y)
                        break
                    y = dst.find(anchor, y + 1, stop)
            for y in candidates:
                c = (x - s0) + (y - d0)
                if c < cost:
                    cost = c
                    best = (y, x) if flip else (x, y)
            x = _next_lines(src, x, s_end, 1)
    return best


def _count_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _line_starts(data: bytes, pos: int, floor: int) -> bool:
    return pos == floor or data[pos - 1:pos] == b"\n"


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix: 64 KiB slices compared at C speed, then a bisection."""
    n = min(len(a), len(b))
    i = 0
    while i < n:
        k = min(_CHUNK, n - i)
        if a[i:i + k] == b[i:i + k]:
            i += k
            continue
        lo, hi = i, i + k  # equal below lo, first difference in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        return lo
    return n


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """Length of the common suffix, at most ``limit``."""
    la, lb = len(a), len(b)
    i = 0
    while i < limit:
        k = min(_CHUNK, limit - i)
        if a[la - i - k:la - i] == b[lb - i - k:lb - i]:
            i += k
            continue
        lo, hi = i, i + k
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if a[la - mid:la - lo] == b[lb - mid:lb - lo]:
                lo = mid
            else:
                hi = mid
        return lo
    return limit


def _replace_middle(old: bytes, new: bytes, old_label: str, new_label: str) -> DiffResult:
    """The differing middle of two files as one replacement: what an out-of-budget search falls back
    to. Correct and applicable by patch; GNU would align the lines more finely."""
    a, b = split_lines(old), split_lines(new)
    pre, suf = _trim(a, b)
    changes = [Change(pre, pre, len(a) - suf - pre, len(b) - suf - pre)]
    return _format(changes, a.__getitem__, b.__getitem__, len(a), len(b), old_label, new_label)


# --------------------------------------------------------------------------------------------
# Windowed diff for large files
# --------------------------------------------------------------------------------------------


@dataclass
class _Unit:
    """A line-aligned stretch of the old file (and its image in the new one) analysed on its own."""

    o0: int
    o1: int
    n0: int
    n1: int
    line0: int = 0
    """Old line number of ``o0``."""
    delta_lines: int = 0
    """New line number of ``n0`` minus ``line0``."""
    complex: bool = False
    single: int = -1
    """Dense mode: the one line every span of this unit lies in, without a newline in or out; else -1."""


def _line_start(data: bytes, pos: int) -> int:
    return data.rfind(b"\n", 0, pos) + 1


def _line_end(data: bytes, pos: int) -> int:
    """End (exclusive, after the newline) of the line containing byte ``pos``."""
    k = data.find(b"\n", pos)
    return len(data) if k < 0 else k + 1


def _extend(data: bytes, start: int, end: int, lines: int) -> tuple[int, int]:
    """Grow a line-aligned byte range by ``lines`` whole lines on each side."""
    for _ in range(lines):
        if start == 0:
            break
        start = _line_start(data, start - 1)
    for _ in range(lines):
        if end >= len(data):
            break
        end = _line_end(data, end)
    return start, end


def _trim(a: list[bytes], b: list[bytes]) -> tuple[int, int]:
    """Common leading and trailing line counts (trailing ones never overlap the leading ones)."""
    pre = 0
    lim = min(len(a), len(b))
    while pre < lim and a[pre] == b[pre]:
        pre += 1
    suf = 0
    while suf < lim - pre and a[len(a) - 1 - suf] == b[len(b) - 1 - suf]:
        suf += 1
    return pre, suf


def _simple_change(a: list[bytes], b: list[bytes], pre: int, suf: int) -> bool:
    """True when the differing middle can only be "delete all of A, insert all of B", unshifted.

    That holds when no line of A equals a line of B (no alignment to choose) and neither run could
    slide (GNU's shift_boundaries moves a run while a neighbour equals its far end).
    """
    ma, mb = a[pre:len(a) - suf], b[pre:len(b) - suf]
    if ma and mb and not set(ma).isdisjoint(mb):
        return False
    before = a[pre - 1] if pre else None
    after = a[len(a) - suf] if suf else None
    for run in (ma, mb):
        if run and ((before is not None and before == run[-1]) or (after is not None and run[0] == after)):
            return False
    return True


def _context(data: bytes, o0: int, o1: int, line0: int, nlines: int, cache: dict[int, bytes]) -> None:
    """Cache the CONTEXT lines just before ``o0`` and just after ``o1`` (old-file numbering)."""
    p, ln = o0, line0
    for _ in range(CONTEXT):
        if p == 0:
            break
        q = data.rfind(b"\n", 0, p - 1) + 1
        ln -= 1
        cache[ln] = data[q:p]
        p = q
    p, ln = o1, line0 + nlines
    for _ in range(CONTEXT):
        if p >= len(data):
            break
        q = _line_end(data, p)
        cache[ln] = data[p:q]
        ln += 1
        p = q


def _units(old: bytes, spans: Sequence[tuple[int, int, int]]) -> list[_Unit]:
    """One unit per span (its lines plus one neighbour line each side), overlapping ones merged."""
    units: list[_Unit] = []
    delta = 0
    for start, end, nlen in spans:
        o0 = _line_start(old, start)
        o1 = _line_end(old, end - 1) if end > start else _line_end(old, start)
        o0, o1 = _extend(old, o0, o1, 1)
        d_here = nlen - (end - start)
        if units and o0 < units[-1].o1:
            u = units[-1]
            u.o1 = max(u.o1, o1)
            u.n1 = u.o1 + delta + d_here
        else:
            units.append(_Unit(o0, o1, o0 + delta, o1 + delta + d_here))
        delta += d_here
    return units


def _units_dense(old: bytes, new: bytes, starts: list[int], n_lines: int,
                 spans: Sequence[tuple[int, int, int]]) -> list[_Unit]:
    """:func:`_units` for many spans, by bisecting a precomputed table of line starts."""
    units: list[_Unit] = []
    delta = 0
    last = n_lines - 1
    for start, end, nlen in spans:
        first_line = bisect_right(starts, start) - 1
        last_line = bisect_right(starts, end - 1) - 1 if end > start else first_line
        g0 = first_line - 1 if first_line > 0 else 0
        g1 = last_line + 1 if last_line < last else last
        o0, o1 = starts[g0], min(starts[g1 + 1], len(old))
        d_here = nlen - (end - start)
        inline = (first_line == last_line and old.find(b"\n", start, end) < 0
                  and new.find(b"\n", start + delta, start + delta + nlen) < 0)
        if units and o0 < units[-1].o1:
            u = units[-1]
            u.o1 = max(u.o1, o1)
            u.n1 = u.o1 + delta + d_here
            if not (inline and u.single == first_line):
                u.single = -1
        else:
            units.append(_Unit(o0, o1, o0 + delta, o1 + delta + d_here, line0=g0,
                               single=first_line if inline else -1))
        delta += d_here
    return units


#: Above this many changed lines a windowed diff that cannot be proven GNU's is kept rather than
#: re-run over the whole region (the exact run's search would take seconds in Python).
EXACT_WORK = 3000
#: Diagonal steps the exact whole-region search may take (about a second of CPython on this machine)
#: before the windowed analysis is used instead.
EXACT_STEPS = 4_000_000

#: With more spans than this, the old file's line table is built once instead of searched per span.
DENSE_SPANS = 64


def unified_diff_spans(old: bytes, new: bytes, spans: Sequence[tuple[int, int, int]], *,
                       old_label: str = "a", new_label: str = "b", proven_only: bool = False) -> DiffResult | None:
    """Diff ``old`` -> ``new`` where ``new`` is ``old`` with the byte ``spans`` replaced.

    ``spans`` are ``(start, end, new_length)``: old bytes ``[start, end)`` became ``new_length``
    bytes, sorted and non-overlapping. Only the lines around the spans are split and compared; the
    rest of the file is touched by one ``bytes.count`` pass (line numbers), so the cost follows the
    size of the edits, not of the file. With many spans (``replace_all``) the old file's line table
    is built once (one ``split``) and every lookup is a bisection.

    ``proven_only``: return None instead of any result that is not provably GNU's (the caller then
    runs the exact analysis itself); only for files over :data:`EXACT_LIMIT`.
    """
    if not spans:
        return DiffResult(b"", None, 0)
    if len(old) + len(new) <= EXACT_LIMIT:
        # Small enough to analyse whole, exactly as GNU does (its "confusing lines" counts are
        # taken over the whole differing region, which windows can only approximate) — within a
        # budget: a replace_all over thousands of repeated lines would cost a minute of Python.
        try:
            return unified_diff(old, new, old_label=old_label, new_label=new_label, budget=EXACT_STEPS)
        except WorkExceeded:
            return _replace_middle(old, new, old_label, new_label)
    dense = len(spans) > DENSE_SPANS
    if dense:
        # Many spans (replace_all): the lines compared at C speed give GNU's diff when it is provable,
        # faster than following each span; otherwise the windows below.
        pre_end, xa, xb = _middle(old, new)
        result = _many_changes(old, new, pre_end, xa, xb, old_label, new_label)
        if result is not None:
            return result
        table = old.split(b"\n")
        if table[-1] == b"":
            table.pop()
            old_line = (lambda i: table[i] + b"\n")
        else:
            last_i = len(table) - 1
            old_line = (lambda i: table[i] + b"\n" if i < last_i else table[i])
        # starts[k] = sum of the first k line lengths + k newlines, all at C speed.
        starts = list(map(add, accumulate(map(len, table), initial=0), range(len(table) + 1)))
        units = _units_dense(old, new, starts, len(table), spans)
    else:
        units = _units(old, spans)
    # Line numbers: one pass over the old file; the new file's follow from the newline deltas.
    line0 = pos = 0
    nl_delta = 0
    for u in units:
        if not dense:
            line0 += old.count(b"\n", pos, u.o0)
            pos = u.o0
            u.line0 = line0
        u.delta_lines = nl_delta
        nl_delta += new.count(b"\n", u.n0, u.n1) - old.count(b"\n", u.o0, u.o1)
    nl_old = len(table) - (0 if old.endswith(b"\n") else 1) if dense else line0 + old.count(b"\n", pos)
    n_old = nl_old + (1 if old and not old.endswith(b"\n") else 0)
    n_new = nl_old + nl_delta + (1 if new and not new.endswith(b"\n") else 0)
    cache0: dict[int, bytes] = {}
    cache1: dict[int, bytes] = {}
    changes: list[Change] = []
    pending = False
    estimate = 0  # changed lines of the complex units, an upper bound of GNU's search cost
    for u in units:
        if u.single >= 0:
            # One line became one line (replace_all of in-line text): the change is that line,
            # unless it came out equal or a neighbour equals it (then GNU could slide the run).
            k = u.single
            line_a = old_line(k)
            line_b = new[u.n0 + starts[k] - u.o0:u.n1 - (u.o1 - min(starts[k + 1], len(old)))]
            if line_a == line_b:
                continue
            before = old_line(k - 1) if k > 0 else None
            after = old_line(k + 1) if k + 1 < len(table) else None
            if before not in (line_a, line_b) and after not in (line_a, line_b):
                changes.append(Change(k, k + u.delta_lines, 1, 1))
                cache1[k + u.delta_lines] = line_b
                continue
        a = split_lines(old[u.o0:u.o1])
        b = split_lines(new[u.n0:u.n1])
        pre, suf = _trim(a, b)
        if pre == len(a) and pre == len(b):
            continue
        if _simple_change(a, b, pre, suf):
            l1 = u.line0 + u.delta_lines
            changes.append(Change(u.line0 + pre, l1 + pre, len(a) - suf - pre, len(b) - suf - pre))
            for k in range(pre, len(b) - suf):
                cache1[l1 + k] = b[k]
            if not dense:
                for k, line in enumerate(a):
                    cache0[u.line0 + k] = line
                _context(old, u.o0, u.o1, u.line0, len(a), cache0)
        else:
            u.complex = True
            pending = True
            estimate += len(a) + len(b) - 2 * (pre + suf)
    if pending or not _windows_are_gnu(changes, table if dense else None, cache1, n_old, n_new):
        if proven_only:
            return None
        estimate += sum(c.deleted + c.inserted for c in changes)
        if estimate <= EXACT_WORK:
            # GNU's choice here depends on lines outside the windows (see core.gnudiff_gate): run its
            # algorithm over the whole differing region instead, which is exact — within a budget, so
            # that one edit never takes more than about a second (see _Myers).
            try:
                return unified_diff(old, new, old_label=old_label, new_label=new_label, budget=EXACT_STEPS)
            except WorkExceeded:
                pass
        if pending:
            # Too many changed lines for the exact run in Python (GNU's search is quadratic in them
            # up to its TOO_EXPENSIVE cut-off): each window is analysed like its own GNU run, which
            # gives a correct diff that patch applies, possibly aligned differently from GNU's.
            region0 = units[-1].line0 + old.count(b"\n", units[-1].o0, units[-1].o1) + 1 - units[0].line0
            _analyse_windows(old, new, units, region0, region0 + nl_delta, changes, cache0, cache1)
    changes.sort(key=lambda c: c.line0)
    if dense:
        size = len(old)
        return _format(changes, old_line, cache1.__getitem__, n_old, n_new, old_label, new_label,
                       old_block=lambda i, j: old[starts[i]:min(starts[j], size)])
    return _format(changes, cache0.__getitem__, cache1.__getitem__, n_old, n_new, old_label, new_label)


def _windows_are_gnu(changes: list[Change], table: list[bytes] | None, new_lines: dict[int, bytes],
                     n_old: int, n_new: int) -> bool:
    """True when the per-window changes (all simple) are provably what GNU diff picks.

    See :mod:`core.gnudiff_gate` for the argument. ``table`` (the old file split at ``\\n``, present
    when many spans made it worth building) lets the cost bound leave out changed lines that have
    no match in the other file: GNU discards those before its search, so they cost it nothing.
    """
    if not changes:
        return True
    changes = sorted(changes, key=lambda c: c.line0)
    if not (crossing_runs_cancel([(c.line0, c.deleted) for c in changes if c.deleted])
            and crossing_runs_cancel([(c.line1, c.inserted) for c in changes if c.inserted])):
        return False
    cost = sum(c.deleted + c.inserted for c in changes)
    if cost_bound_ok(cost, n_old + n_new):
        return True
    if table is None:
        return False
    # Counts over GNU's region of the old file, by line text without its newline (``table``'s form):
    # merging a last line that lacks one with its twin only raises counts, so "no match" stays safe.
    gone = Counter(table[k] for c in changes for k in range(c.line0, c.line0 + c.deleted))
    came = Counter(line[:-1] if line[-1:] == b"\n" else line
                   for c in changes for line in map(new_lines.__getitem__, range(c.line1, c.line1 + c.inserted)))
    needed = gone.keys() | came.keys()
    lo = max(changes[0].line0 - _HORIZON, 0)
    hi = min(changes[-1].line0 + changes[-1].deleted + _HORIZON, n_old)
    # Only the changed texts are counted; filtering at C speed keeps this one cheap linear pass.
    count_old = Counter(filter(needed.__contains__, table[lo:hi]))
    for text, n in gone.items():
        if count_old[text] - n + came[text] == 0:  # no match in the new file: always discarded
            cost -= n
    for text, n in came.items():
        if count_old[text] == 0:
            cost -= n
    return cost_bound_ok(cost, n_old + n_new)


def _analyse_windows(old: bytes, new: bytes, units: list[_Unit], region0: int, region1: int,
                     changes: list[Change], cache0: dict[int, bytes], cache1: dict[int, bytes]) -> None:
    """Full GNU-style analysis for the complex units, each in a window of a few lines around it.

    A window reaches GNU's horizon plus a context's width beyond the unit, so the context of a run
    shifted to the edge of its region is still inside it; windows that overlap are merged (and take
    over any simple unit they cover, whose change is then recomputed here).
    """
    margin = _HORIZON + CONTEXT + 1
    budget = [EXACT_STEPS]  # shared by every window's search
    windows: list[tuple[int, int, int, int, int, int]] = []  # (o0, o1, line0, delta_lines, first, last)
    # One pass over the (sorted, disjoint) units: every unit is absorbed into at most one window and
    # scanned at most once in each direction. A unit already inside the open window only lets its
    # margin reach further. (Scanning from every complex unit was quadratic in dense replace_all edits:
    # 76 s for one edit of a repetitive 1 MB file.)
    for idx, u in enumerate(units):
        if not u.complex:
            continue
        if windows and idx <= windows[-1][5]:
            o0, o1, _l0, _d, first, last = windows.pop()
            o1 = max(o1, _extend(old, u.o0, u.o1, margin)[1])
        else:
            o0, o1 = _extend(old, u.o0, u.o1, margin)
            first = last = idx
            floor = windows[-1][5] if windows else -1  # units up to here belong to the previous window
            while first - 1 > floor and units[first - 1].o1 > o0:
                first -= 1
                o0 = min(o0, _extend(old, units[first].o0, units[first].o1, margin)[0])
            if first - 1 == floor and floor >= 0 and units[floor].o1 > o0:
                o0 = min(o0, windows[-1][0])  # reaches into the previous window: merged below
        while last + 1 < len(units) and units[last + 1].o0 < o1:
            last += 1
            o1 = max(o1, _extend(old, units[last].o0, units[last].o1, margin)[1])
        if windows and o0 < windows[-1][1]:
            po0, _po1, _pl0, _pd, pfirst, _pl = windows.pop()
            o0, first = min(o0, po0), min(first, pfirst)
        fu, lu = units[first], units[last]
        line0 = fu.line0 - old.count(b"\n", o0, fu.o0)
        windows.append((o0, o1, line0, fu.delta_lines, first, last))
    drop: set[int] = set()
    # The changes by first line (kept sorted as windows add theirs): each window finds the ones it
    # covers by bisection. (Scanning every change for every window was quadratic: a third of the
    # time of a replace_all over a repetitive 300 kB file with thousands of windows.)
    by_line = sorted(changes, key=lambda c: c.line0)
    keys = [c.line0 for c in by_line]
    for o0, o1, line0, dl, first, last in windows:
        fu, lu = units[first], units[last]
        n0 = o0 + (fu.n0 - fu.o0)
        n1 = o1 + (lu.n1 - lu.o1)
        a = split_lines(old[o0:o1])
        b = split_lines(new[n0:n1])
        pre, suf = _trim(a, b)
        # Simple units inside this window were already counted: replace their changes.
        lo_line, hi_line = line0, line0 + len(a)
        drop.update(map(id, by_line[bisect_left(keys, lo_line):bisect_left(keys, hi_line)]))
        if pre == len(a) and pre == len(b):
            continue
        lo = max(pre - _HORIZON, 0)
        hi0 = min(len(a) - suf + _HORIZON, len(a))
        hi1 = min(len(b) - suf + _HORIZON, len(b))
        try:
            ch0, ch1 = analyze(a[lo:hi0], b[lo:hi1], region0, region1, budget)
            found = changes_of(ch0, ch1, line0 + lo, line0 + dl + lo)
        except WorkExceeded:
            # Out of budget: the window's differing middle as one replacement. A correct diff that
            # patch applies, bounded in time; only its alignment may differ from GNU's.
            found = [Change(line0 + pre, line0 + dl + pre, len(a) - suf - pre, len(b) - suf - pre)]
        changes.extend(found)
        for c in found:
            k = bisect_right(keys, c.line0)
            keys.insert(k, c.line0)
            by_line.insert(k, c)
        keep = {id(c) for c in found}
        drop.difference_update(keep)
        for k, line in enumerate(a):
            cache0[line0 + k] = line
        for k, line in enumerate(b):
            cache1[line0 + dl + k] = line
    if drop:
        changes[:] = [c for c in changes if id(c) not in drop]


# --------------------------------------------------------------------------------------------
# Many changes in a large file (issue 18: replace_all over an 8 MB file was 5-8x GNU's time)
# --------------------------------------------------------------------------------------------
#
# Past _SYNC_SPANS changes the byte resynchronisation above costs tens of Python steps per change,
# and the exact analysis hashes every line, slides every run and formats hunks line by line. Here
# the middle is split once and compared line against line at C speed (``map(ne, ...)`` over list
# slices, runs of mismatches found by a regex over the flags); where lines were inserted or deleted,
# the nearest place with _LINE_SYNC equal lines is looked up with ``list.index``. The changes found
# are taken only when the argument of :mod:`.gnudiff_gate` proves them GNU's (the same checks as the
# windowed diff: each change simple, crossing runs cancelled, the search cost bounded); otherwise the
# caller analyses the region exactly. Hunks are printed with ``bytes.join`` over runs of lines.

#: Equal lines that must follow a stretch of mismatches at the same offset for it to be taken as a
#: replacement of those lines; otherwise the offset is resynchronised.
_LINE_SYNC = 8
#: Lines of each file tried as the start of the next equal stretch, each looked for within
#: _LINE_AHEAD lines of the other file.
_LINE_PROBES = 32
_LINE_AHEAD = 4096
#: Python steps the resynchronisation may take over one diff before it leaves it to the exact run.
_LINE_WORK = 200_000
_MISMATCHES = re.compile(rb"\x01+")


class _Changes:
    """Changes as four parallel lists: ``deleted[i]`` lines of ``a`` at ``x[i]`` became ``inserted[i]``
    lines of ``b`` at ``y[i]`` (the checks and the printer below work on whole lists at C speed)."""

    __slots__ = ("x", "y", "deleted", "inserted")

    def __init__(self) -> None:
        self.x: list[int] = []
        self.y: list[int] = []
        self.deleted: list[int] = []
        self.inserted: list[int] = []

    def add(self, x: int, y: int, d: int, k: int) -> None:
        self.x.append(x)
        self.y.append(y)
        self.deleted.append(d)
        self.inserted.append(k)


def _line_changes(a: list[bytes], b: list[bytes]) -> _Changes | None:
    """Changes that turn ``a`` into ``b``, each starting at a line that differs (so a change that
    deletes and inserts lines has ``a[x] != b[y]``) and ending at one; None when the equal lines after
    a change are not found nearby (the caller then runs the exact analysis). Any changes returned
    are correct; whether they are GNU's is decided by the caller."""
    na, nb = len(a), len(b)
    out = _Changes()
    xs, ys, ds, ks = out.x, out.y, out.deleted, out.inserted
    i = j = 0
    chunk = 256
    work = [_LINE_WORK]
    while i < na and j < nb:
        m = min(chunk, na - i, nb - j)
        flags = bytes(map(ne, a[i:i + m], b[j:j + m]))
        whole = i + m == na and j + m == nb
        # The commonest stretch (replace_all): only single mismatched lines, each followed by
        # _LINE_SYNC equal ones, taken all at once from the lengths of the equal runs between them.
        equal = list(map(len, flags.split(b"\x01")))
        if len(equal) == 1 or (min(equal[1:-1], default=_LINE_SYNC) >= _LINE_SYNC
                               and (equal[-1] >= _LINE_SYNC or whole)):
            if len(equal) > 1:
                at_ = list(map(add, accumulate(equal[:-1]), range(len(equal) - 1)))
                xs.extend(map(add, at_, repeat(i)))
                ys.extend(map(add, at_, repeat(j)))
                ds.extend(repeat(1, len(at_)))
                ks.extend(repeat(1, len(at_)))
            i += m
            j += m
            chunk = min(chunk << 1, 1 << 16)
            continue
        at, resync = -1, False
        runs = [found.span() for found in _MISMATCHES.finditer(flags)]
        r = 0
        while r < len(runs):
            # a group of runs each less than _LINE_SYNC lines from the next: replacements at this
            # offset if _LINE_SYNC equal lines follow the group
            g = r
            while g + 1 < len(runs) and runs[g + 1][0] < runs[g][1] + _LINE_SYNC:
                g += 1
            s, e = runs[r][0], runs[g][1]
            # ... and the group looks like nearby edits of a line or two, not the same lines shifted
            # (which mismatch nearly everywhere): every gap at least 2 lines, no more mismatched lines
            # than equal ones. A longer run is left to the resynchronisation, which also finds an
            # insertion followed by a deletion (a replacement of the lines between would be wrong).
            changed = sum(e1 - s1 for s1, e1 in runs[r:g + 1])
            sparse = max(e1 - s1 for s1, e1 in runs[r:g + 1]) <= 2 and (
                g == r or (changed <= (e - s) - changed
                           and min(runs[t + 1][0] - runs[t][1] for t in range(r, g)) >= 2))
            if sparse and (e + _LINE_SYNC <= m or whole):
                for s1, e1 in runs[r:g + 1]:  # the same number of lines replaced
                    xs.append(i + s1)
                    ys.append(j + s1)
                    ds.append(e1 - s1)
                    ks.append(e1 - s1)
                r = g + 1
                continue
            if sparse and s > 0 and m == chunk:
                at = s  # too near the end of this stretch to tell: compare again from there
            else:
                at, resync = s, True  # lines were inserted or deleted here
            break
        if at < 0:
            i += m
            j += m
            chunk = min(chunk << 1, 1 << 16)
            continue
        i += at
        j += at
        if resync:
            found_at = _line_sync(a, b, i, j, work)
            if found_at is None:
                return None
            x, y = found_at
            d, k = x - i, y - j
            while d and k and a[i + d - 1] == b[j + k - 1]:  # a common tail is context, not change
                d -= 1
                k -= 1
            out.add(i, j, d, k)
            i, j = x, y
            chunk = 256
    if i < na or j < nb:
        out.add(i, j, na - i, nb - j)
    return out


def _line_sync(a: list[bytes], b: list[bytes], x: int, y: int, work: list[int]) -> tuple[int, int] | None:
    """The nearest (by lines skipped in both) ``(x2, y2)`` from which _LINE_SYNC lines of ``a`` and
    ``b`` are equal, or the rest of both is; None if none among the probed lines (or out of work)."""
    best: tuple[int, int] | None = None
    cost = 1 << 62
    na, nb = len(a), len(b)
    if na - x <= _LINE_AHEAD and nb - y <= _LINE_AHEAD:
        best, cost = (na, nb), (na - x) + (nb - y)  # the rest of both is one change
    for src, s0, dst, d0, flip in ((a, x, b, y, False), (b, y, a, x, True)):
        ns, nd = len(src), len(dst)
        for p in range(_LINE_PROBES):
            xs = s0 + p
            if xs >= ns or p >= cost:
                break
            anchor = src[xs:xs + _LINE_SYNC]
            yd = -1
            if xs + _LINE_SYNC >= ns:
                # fewer than _LINE_SYNC lines left: they must be the rest of the other file too
                k = nd - len(anchor)
                if k >= d0 and dst[k:] == anchor:
                    yd = k
            else:
                line = anchor[0]
                k, stop = d0, min(nd, d0 + _LINE_AHEAD, d0 + cost - p)
                while k < stop:
                    work[0] -= 1
                    if work[0] < 0:
                        return None
                    try:
                        k = dst.index(line, k, stop)
                    except ValueError:
                        break
                    if dst[k:k + _LINE_SYNC] == anchor:
                        yd = k
                        break
                    k += 1
            if yd >= 0 and p + (yd - d0) < cost:
                cost = p + (yd - d0)
                best = (yd, xs) if flip else (xs, yd)
    return best


def _many_changes(old: bytes, new: bytes, pre_end: int, xa: int, xb: int, old_label: str,
                  new_label: str) -> DiffResult | None:
    """GNU's diff of ``old`` and ``new`` (``old[pre_end:xa]`` became ``new[pre_end:xb]``, both at line
    boundaries) from lines compared at C speed, or None when it cannot be proven GNU's."""
    # The middle with _HORIZON + 1 identical lines each side: every change's neighbours and GNU's
    # region are inside it.
    lo = pre_end
    for _ in range(_HORIZON + 1):
        if lo == 0:
            break
        lo = old.rfind(b"\n", 0, lo - 1) + 1
    hi0 = xa
    for _ in range(_HORIZON + 1):
        if hi0 >= len(old):
            break
        hi0 = _line_end(old, hi0)
    hi1 = xb + (hi0 - xa)
    a, b = _split(old[lo:hi0]), _split(new[lo:hi1])
    ch = _line_changes(a, b)
    if not ch or not ch.x:
        return None
    base = old.count(b"\n", 0, lo)
    # whole-file line counts: the split lines, those before them and those after (no second pass)
    n0 = base + len(a) + (old.count(b"\n", hi0) + (not old.endswith(b"\n")) if hi0 < len(old) else 0)
    n1 = base + len(b) + (new.count(b"\n", hi1) + (not new.endswith(b"\n")) if hi1 < len(new) else 0)
    if not _changes_are_gnu(ch, a, b, lo == 0, hi0 == len(old), n0 + n1):
        return None
    return _format_lines(ch, a, b, base, n0, n1, old_label, new_label)


def _changes_are_gnu(ch: _Changes, a: list[bytes], b: list[bytes], at_start: bool, at_end: bool,
                     total: int) -> bool:
    """True when the changes are provably GNU's: the windowed diff's argument (:func:`_windows_are_gnu`,
    :mod:`.gnudiff_gate`), checked over whole lists at C speed. Each change must be one the windowed
    diff calls simple (``_simple_change``): at least two identical lines from the previous one, its
    deleted and inserted lines sharing no line, neither run able to slide (a neighbour equal to its
    far end); and its neighbours inside ``a`` (``at_start`` / ``at_end``: ``a`` begins / ends its file)."""
    xs, ys, ds, ks = ch.x, ch.y, ch.deleted, ch.inserted
    n, na = len(xs), len(a)
    ends = list(map(add, xs, ds))
    if n > 1 and min(map(sub, xs[1:], ends[:-1])) < 2:
        return False
    if (xs[0] == 0 and not at_start) or (ends[-1] >= na and not at_end):
        return False
    for idx in compress(range(n), map(or_, map(gt, ds, repeat(1)), map(gt, ks, repeat(1)))):
        x, y, d, k = xs[idx], ys[idx], ds[idx], ks[idx]
        if d and k and not set(a[x:x + d]).isdisjoint(b[y:y + k]):
            return False
    # Neighbours: the line before and the line after each change; past either end of the file, a
    # pad that equals no line.
    pad = object()
    get, bget = a.__getitem__, b.__getitem__
    before = list(map(get, map(sub, xs, repeat(1))))
    if xs[0] == 0:
        before[0] = pad
    after = list(map(get, ends[:-1]))
    after.append(a[ends[-1]] if ends[-1] < na else pad)
    one_for_one = min(ds) == 1 == max(ds) and min(ks) == 1 == max(ks)  # (replace_all)
    if one_for_one:
        lost, won = list(map(get, xs)), list(map(bget, ys))
        if any(map(eq, lost, before)) or any(map(eq, lost, after)) or any(map(eq, won, before)) \
                or any(map(eq, won, after)):
            return False
    # deleted runs: last line vs the one before, first line vs the one after
    elif any(map(eq, map(get, map(sub, compress(ends, ds), repeat(1))), compress(before, ds))) or \
            any(map(eq, map(get, compress(xs, ds)), compress(after, ds))):
        return False
    # inserted runs, likewise
    yk = list(compress(ys, ks))
    if not one_for_one and (
            any(map(eq, map(bget, map(sub, map(add, yk, compress(ks, ks)), repeat(1))), compress(before, ks)))
            or any(map(eq, map(bget, yk), compress(after, ks)))):
        return False
    if not (crossing_blocks_cancel(list(compress(xs, ds)), list(compress(ds, ds)))
            and crossing_blocks_cancel(yk, list(compress(ks, ks)))):
        return False
    cost = sum(ds) + sum(ks)
    if cost_bound_ok(cost, total):
        return True
    # As in _windows_are_gnu: changed lines without a match in the other file cost GNU's search
    # nothing (its discard pass drops them). Counts over GNU's region of the old file.
    lo_r, hi_r = xs[0] - _HORIZON, ends[-1] + _HORIZON
    if (lo_r < 0 and not at_start) or (hi_r > na and not at_end):
        return False
    if one_for_one:
        gone, came = Counter(lost), Counter(won)
    else:
        gone = Counter(chain.from_iterable(map(get, map(slice, xs, ends))))
        came = Counter(chain.from_iterable(map(bget, map(slice, ys, map(add, ys, ks)))))
    needed = gone.keys() | came.keys()
    # only lines as long as a changed one can be one (lengths are free, hashes are not)
    sizes = set(map(len, needed))
    region = a if lo_r <= 0 and hi_r >= na else a[max(lo_r, 0):hi_r]
    count_old = Counter(filter(needed.__contains__, compress(region, map(sizes.__contains__, map(len, region)))))
    # a deleted text none of whose old lines is kept and that is not inserted; an inserted text that
    # is not in the old region (set operations and maps: no Python step per text)
    only = list(gone.keys() - came.keys())
    cost -= sum(compress(map(gone.__getitem__, only), map(eq, map(count_old.__getitem__, only),
                                                            map(gone.__getitem__, only))))
    cost -= sum(map(came.__getitem__, came.keys() - count_old.keys()))
    return cost_bound_ok(cost, total)


def _format_lines(ch: _Changes, a: list[bytes], b: list[bytes], base: int, n0: int, n1: int,
                  old_label: str, new_label: str) -> DiffResult:
    """:func:`_format` for changes indexing ``a`` / ``b`` (lines without their newline, as
    :func:`_split` gives them; line ``base`` of both files is ``a[0]`` / ``b[0]``): each run of lines
    is one ``bytes.join``; a hunk that shows a last line without a newline is printed by
    :func:`_format` itself."""
    header = b"--- " + old_label.encode() + b"\n+++ " + new_label.encode() + b"\n"
    xs, ys, ds, ks = ch.x, ch.y, ch.deleted, ch.inserted
    nch = len(xs)
    ends = list(map(add, xs, ds))
    # local index of each file's last line when it has no newline (-1: it has one, or is not here)
    eol0 = n0 - 1 - base if a and a[-1][-1:] == _NO_EOL else -1
    eol1 = n1 - 1 - base if b and b[-1][-1:] == _NO_EOL else -1
    last0, last1 = n0 - 1 - base, n1 - 1 - base
    # hunks: a gap of 2 * CONTEXT + 1 identical lines or more between two changes starts a new one
    firsts = [0, *compress(range(1, nch), map(ge, map(sub, xs[1:], ends[:-1]), repeat(2 * CONTEXT + 1)))]
    lasts = [f - 1 for f in firsts[1:]] + [nch - 1]
    hunks: list[bytes | None] = [None] * len(firsts)
    # The commonest hunk, one line replaced by one with full context on both sides (replace_all), is
    # printed for all such hunks at once: each piece is a map over the hunks.
    xf, yf = list(map(xs.__getitem__, firsts)), list(map(ys.__getitem__, firsts))
    regular = list(map(all, zip(map(eq, firsts, lasts), map(eq, map(ds.__getitem__, firsts), repeat(1)),
                                map(eq, map(ks.__getitem__, firsts), repeat(1)),
                                map(ge, xf, repeat(CONTEXT)), map(ge, yf, repeat(CONTEXT)),
                                map(lt, xf, repeat(last0 - CONTEXT)), map(lt, yf, repeat(last1 - CONTEXT)))))
    if any(regular):
        rx, ry = list(compress(xf, regular)), list(compress(yf, regular))
        size = 2 * CONTEXT + 1
        # one bytes formatting per hunk: its header, CONTEXT lines, the change, CONTEXT lines
        form = (b"@@ -%%d,%d +%%d,%d @@\n" % (size, size) + b" %b\n" * CONTEXT + b"-%b\n+%b\n"
                + b" %b\n" * CONTEXT)
        get = a.__getitem__
        texts = map(form.__mod__, zip(
            map(add, rx, repeat(base + 1 - CONTEXT)), map(add, ry, repeat(base + 1 - CONTEXT)),
            *[map(get, map(add, rx, repeat(t))) for t in range(-CONTEXT, 0)],
            map(get, rx), map(b.__getitem__, ry),
            *[map(get, map(add, rx, repeat(t))) for t in range(1, CONTEXT + 1)]))
        for h, text in zip(compress(range(len(firsts)), regular), texts):
            hunks[h] = text
    for h, (first, last) in enumerate(zip(firsts, lasts)):
        if regular[h]:
            continue
        out = []
        add_, extend = out.append, out.extend
        x, y = xs[first], ys[first]
        f0, f1 = max(x - CONTEXT, 0), max(y - CONTEXT, 0)
        l0 = min(ends[last] - 1 + CONTEXT, last0)
        l1 = min(ys[last] + ks[last] - 1 + CONTEXT, last1)
        if l0 == eol0 or l1 == eol1:
            # GNU's "\ No newline at end of file" marker: the line-by-line printer
            def line_of(lines: list[bytes]):
                def line(i: int) -> bytes:
                    text = lines[i - base]
                    return text[:-1] if text[-1:] == _NO_EOL else text + b"\n"
                return line
            part = [Change(base + xs[c], base + ys[c], ds[c], ks[c]) for c in range(first, last + 1)]
            hunks[h] = _format(part, line_of(a), line_of(b), n0, n1, old_label, new_label).text[len(header):]
            continue
        c0, c1 = l0 - f0 + 1, l1 - f1 + 1
        if c0 > 1 and c1 > 1:
            add_(b"@@ -%d,%d +%d,%d @@\n" % (base + f0 + 1, c0, base + f1 + 1, c1))
        else:
            add_(b"@@ -" + _range(base + f0, base + l0) + b" +" + _range(base + f1, base + l1) + b" @@\n")
        i = f0
        for c in range(first, last + 1):
            x, d, k = xs[c], ds[c], ks[c]
            if i < x:
                extend((b" ", b"\n ".join(a[i:x]), b"\n"))
            if d == 1:
                extend((b"-", a[x], b"\n"))
            elif d:
                extend((b"-", b"\n-".join(a[x:x + d]), b"\n"))
            if k == 1:
                extend((b"+", b[ys[c]], b"\n"))
            elif k:
                extend((b"+", b"\n+".join(b[ys[c]:ys[c] + k]), b"\n"))
            i = x + d
        if i <= l0:
            extend((b" ", b"\n ".join(a[i:l0 + 1]), b"\n"))
        hunks[h] = b"".join(out)
    y, k = ys[0], ks[0]
    first_line = base + y + 1 if k else min(base + y + 1, max(n1, 1))
    return DiffResult(header + b"".join(hunks), first_line, len(firsts))
