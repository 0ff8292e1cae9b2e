"""GNU diff's analysis of one region, ported: the "confusing lines" discard pass, Myers' O(ND)
middle-snake search with GNU's "too expensive" cut-off, and the boundary-shifting canonicalisation.

Hand-written because no library reproduces GNU's choices (difflib aligns differently); written from the
description of GNU diffutils' ``analyze.c`` so that :mod:`relay_jupyter.core.diff` can emit hunks that are
byte-identical to ``diff -u``. Split from ``core/diff.py``, which formats hunks and windows large files.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat

__all__ = ["Change", "WorkExceeded", "analyze", "changes_of"]

# Speed (issue 18: the general diff of an 8 MB file was 8.8x GNU's time): every pass that touches each
# line runs at C speed -- counts with ``Counter``, discard codes with ``map``/``bytes``, kept lines with
# ``itertools.compress``, runs of equal lines by comparing list slices (galloping), stretches without
# changes skipped with ``bytearray.find`` -- while the Python code still makes GNU's decisions, one per
# change. Same algorithm and results as before; ``tests/core/test_diff_gnu_random.py`` checks them.
_CHANGED = bytes([0]) + bytes([1]) * 255  # translate table: discard code (1 or 2) -> changed flag
_KEPT = bytes([1]) + bytes(255)           # translate table: code 0 -> kept
_ABSENT = bytes([1]) + bytes(255)         # translate table: not in the other file (0) -> code 1
_TWICE = bytes([0, 2]) + bytes(254)       # translate table: frequent (1) -> code 2
_RUNS = re.compile(rb"[\x01\x02]+")


@dataclass(frozen=True)
class Change:
    """One run of changed lines: ``deleted`` old lines at ``line0`` became ``inserted`` new lines at ``line1``.

    Line numbers are 0-based indexes into the whole old / new file.
    """

    line0: int
    line1: int
    deleted: int
    inserted: int




def _discard_confusing(eq0: Sequence, eq1: Sequence, n_total0: int, n_total1: int
                       ) -> tuple[bool | None, bool | None, bytearray, bytearray]:
    """Drop lines that cannot match (and provisionally, lines that match too often) before Myers.

    Returns (file 0 discards some line, file 1 does, changed0, changed1) with discarded lines marked
    (None: that file keeps every line).
    ``n_total*`` is the size of the whole compared region, which sets the "too many matches" bar.
    """
    set0, set1 = set(eq0), set(eq1)
    out: list = []
    for equivs, other_seq, other, total in ((eq0, eq1, set1, n_total0), (eq1, eq0, set0, n_total1)):
        many = 5
        tem = total // 64
        while True:
            tem >>= 2
            if tem <= 0:
                break
            many *= 2
        disc = bytearray(map(other.__contains__, equivs)).translate(_ABSENT)  # 1: no match at all
        if len(other_seq) - len(other) >= many:
            # some line of the other file may repeat more than ``many`` times (else it cannot)
            frequent = {e for e, n in Counter(other_seq).items() if n > many}
            if frequent:
                disc = bytearray(map(max, disc, bytearray(map(frequent.__contains__, equivs)).translate(_TWICE)))
        if 2 in disc:
            # runs of discards are settled independently (nothing crosses a kept line)
            for start, end in [m.span() for m in _RUNS.finditer(disc)]:
                run = disc[start:end]
                _settle_provisional(run)
                disc[start:end] = run
        if 1 in disc or 2 in disc:
            out.append((True, disc.translate(_CHANGED)))
        else:
            out.append((None, disc))
    (keep0, changed0), (keep1, changed1) = out
    return keep0, keep1, changed0, changed1


def _settle_provisional(disc: bytearray) -> None:
    """Keep a provisional discard (2) only inside a run of certain discards (1), as GNU does."""
    end = len(disc)
    i = 0
    while i < end:
        if disc[i] == 2:
            disc[i] = 0
        elif disc[i] != 0:
            provisional = 0
            j = i
            while j < end:
                if disc[j] == 0:
                    break
                if disc[j] == 2:
                    provisional += 1
                j += 1
            while j > i and disc[j - 1] == 2:
                j -= 1
                disc[j] = 0
                provisional -= 1
            length = j - i
            if provisional * 4 > length:
                while j > i:
                    j -= 1
                    if disc[j] == 2:
                        disc[j] = 0
            else:
                minimum = 1
                tem = length >> 2
                while True:
                    tem >>= 2
                    if tem <= 0:
                        break
                    minimum <<= 1
                minimum += 1
                j = 0
                consec = 0
                while j < length:
                    if disc[i + j] != 2:
                        consec = 0
                    else:
                        consec += 1
                        if consec == minimum:
                            j -= consec  # back up to the start of the sub-run to cancel all of it
                        elif consec > minimum:
                            disc[i + j] = 0
                    j += 1
                _edge_scan(disc, i, length, 1)
                i += length - 1
                _edge_scan(disc, i, length, -1)
        i += 1


def _edge_scan(disc: bytearray, i: int, length: int, step: int) -> None:
    """From one end of a run, cancel provisionals until 3 certain discards in a row (or 8 lines in)."""
    consec = 0
    for j in range(length):
        k = i + j * step
        if j >= 8 and disc[k] == 1:
            break
        if disc[k] == 2:
            consec = 0
            disc[k] = 0
        elif disc[k] == 0:
            consec = 0
        else:
            consec += 1
        if consec == 3:
            break


def _run_forward(xv: Sequence, yv: Sequence, x: int, y: int, n: int) -> int:
    """How many of ``xv[x:]`` and ``yv[y:]`` are equal from the start (at most ``n``): a few steps one
    by one, then list slices compared at C speed, doubling in size, and a bisection in the last one."""
    k = 0
    while k < n and k < 8:
        if xv[x + k] != yv[y + k]:
            return k
        k += 1
    step = 8
    while k < n:
        m = min(step, n - k)
        if xv[x + k:x + k + m] == yv[y + k:y + k + m]:
            k += m
            step <<= 1
            continue
        lo, hi = k, k + m  # equal below lo; the first difference is in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if xv[x + lo:x + mid] == yv[y + lo:y + mid]:
                lo = mid
            else:
                hi = mid
        return lo
    return k


def _run_backward(xv: Sequence, yv: Sequence, x: int, y: int, n: int) -> int:
    """How many of ``xv[:x]`` and ``yv[:y]`` are equal from the end (at most ``n``)."""
    k = 0
    while k < n and k < 8:
        if xv[x - 1 - k] != yv[y - 1 - k]:
            return k
        k += 1
    step = 8
    while k < n:
        m = min(step, n - k)
        if xv[x - k - m:x - k] == yv[y - k - m:y - k]:
            k += m
            step <<= 1
            continue
        lo, hi = k, k + m
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if xv[x - mid:x - lo] == yv[y - mid:y - lo]:
                lo = mid
            else:
                hi = mid
        return lo
    return k


class WorkExceeded(Exception):
    """The exact search would take longer than its budget (see ``EXACT_STEPS``)."""


class _Myers:
    """Myers' divide-and-conquer shortest edit script over two int sequences (GNU diffseq semantics).

    ``budget`` is a one-item list holding the diagonals that may still be examined, shared by the
    searches of one diff (None: unbounded). GNU runs this search in C; in Python
    a region with thousands of changes among hundreds of thousands of equal lines costs a minute, so
    the large-file path gives it a budget and falls back to per-window analysis when it runs out.
    """

    def __init__(self, xv: list[int], yv: list[int], budget: list[int] | None = None) -> None:
        self.xv = xv
        self.yv = yv
        self.budget = budget
        n = len(xv) + len(yv) + 3
        self.off = len(yv) + 1
        self.fd = [0] * n
        self.bd = [0] * n
        diags = len(xv) + len(yv) + 3
        too = 1
        while diags:
            diags >>= 2
            too <<= 1
        self.too_expensive = max(4096, too)
        self.xdel: list[int] = []
        self.yins: list[int] = []

    def _diag(self, xoff: int, xlim: int, yoff: int, ylim: int, minimal: bool
              ) -> tuple[int, int, bool, bool]:
        xv, yv, fd, bd, o = self.xv, self.yv, self.fd, self.bd, self.off
        dmin, dmax = xoff - ylim, xlim - yoff
        fmid, bmid = xoff - yoff, xlim - ylim
        fmin = fmax = fmid
        bmin = bmax = bmid
        odd = (fmid - bmid) & 1
        fd[o + fmid] = xoff
        bd[o + bmid] = xlim
        big = 1 << 62
        c = 1
        while True:
            if self.budget is not None:
                self.budget[0] -= (fmax - fmin) + (bmax - bmin) + 2
                if self.budget[0] < 0:
                    raise WorkExceeded
            if fmin > dmin:
                fmin -= 1
                fd[o + fmin - 1] = -1
            else:
                fmin += 1
            if fmax < dmax:
                fmax += 1
                fd[o + fmax + 1] = -1
            else:
                fmax -= 1
            for d in range(fmax, fmin - 1, -2):
                tlo, thi = fd[o + d - 1], fd[o + d + 1]
                x = thi if tlo < thi else tlo + 1
                y = x - d
                if x < xlim and y < ylim and xv[x] == yv[y]:
                    x += _run_forward(xv, yv, x, y, min(xlim - x, ylim - y))
                    y = x - d
                fd[o + d] = x
                if odd and bmin <= d <= bmax and bd[o + d] <= x:
                    return x, y, True, True
            if bmin > dmin:
                bmin -= 1
                bd[o + bmin - 1] = big
            else:
                bmin += 1
            if bmax < dmax:
                bmax += 1
                bd[o + bmax + 1] = big
            else:
                bmax -= 1
            for d in range(bmax, bmin - 1, -2):
                tlo, thi = bd[o + d - 1], bd[o + d + 1]
                x = tlo if tlo < thi else thi - 1
                y = x - d
                if xoff < x and yoff < y and xv[x - 1] == yv[y - 1]:
                    x -= _run_backward(xv, yv, x, y, min(x - xoff, y - yoff))
                    y = x - d
                bd[o + d] = x
                if not odd and fmin <= d <= fmax and x <= fd[o + d]:
                    return x, y, True, True
            if not minimal and c >= self.too_expensive:
                # Give up on optimality: split at the furthest-reaching diagonal seen so far.
                fxybest, fxbest = -1, 0
                for d in range(fmax, fmin - 1, -2):
                    x = min(fd[o + d], xlim)
                    y = x - d
                    if ylim < y:
                        x, y = ylim + d, ylim
                    if fxybest < x + y:
                        fxybest, fxbest = x + y, x
                bxybest, bxbest = big, 0
                for d in range(bmax, bmin - 1, -2):
                    x = max(xoff, bd[o + d])
                    y = x - d
                    if y < yoff:
                        x, y = yoff + d, yoff
                    if x + y < bxybest:
                        bxybest, bxbest = x + y, x
                if (xlim + ylim) - bxybest < fxybest - (xoff + yoff):
                    return fxbest, fxybest - fxbest, True, False
                return bxbest, bxybest - bxbest, False, True
            c += 1

    def run(self) -> None:
        """Fill ``xdel`` / ``yins`` with the indexes (into xv / yv) that are not matched."""
        xv, yv = self.xv, self.yv
        stack = [(0, len(xv), 0, len(yv), False)]
        while stack:
            xoff, xlim, yoff, ylim, minimal = stack.pop()
            k = _run_forward(xv, yv, xoff, yoff, min(xlim - xoff, ylim - yoff))
            xoff += k
            yoff += k
            k = _run_backward(xv, yv, xlim, ylim, min(xlim - xoff, ylim - yoff))
            xlim -= k
            ylim -= k
            if xoff == xlim:
                self.yins.extend(range(yoff, ylim))
            elif yoff == ylim:
                self.xdel.extend(range(xoff, xlim))
            else:
                xmid, ymid, lo_min, hi_min = self._diag(xoff, xlim, yoff, ylim, minimal)
                stack.append((xmid, xlim, ymid, ylim, hi_min))
                stack.append((xoff, xmid, yoff, ymid, lo_min))


def _shift_boundaries(equivs: list[int], changed: bytearray, other: bytearray) -> None:
    """Slide each run of changes to its canonical place (GNU's shift_boundaries).

    ``changed`` / ``other`` carry a 0 sentinel at both ends (index 0 and -1); line k is at k + 1.
    """
    i_end = len(equivs)
    # With the sentinel layout, changed[k + 1] is line k; equivs indexes are plain.
    i = 0
    j = 0
    while True:
        while i < i_end and not changed[i + 1]:
            # a stretch where neither file has a change moves i and j together: skip it at C speed
            ni, nj = changed.find(1, i + 1), other.find(1, j + 1)
            steps = min((i_end + 1 if ni < 0 else ni) - 1 - i, (len(other) if nj < 0 else nj) - 1 - j)
            if steps > 0:
                i += steps
                j += steps
                continue
            while other[j + 1]:
                j += 1
            j += 1
            i += 1
        if i == i_end:
            break
        start = i
        i += 1
        while changed[i + 1]:
            i += 1
        while other[j + 1]:
            j += 1
        while True:
            runlength = i - start
            while start and equivs[start - 1] == equivs[i - 1]:
                start -= 1
                changed[start + 1] = 1
                i -= 1
                changed[i + 1] = 0
                while changed[start]:  # line start - 1
                    start -= 1
                j -= 1
                while other[j + 1]:
                    j -= 1
            corresponding = i if other[j] else i_end  # other line j - 1
            while i != i_end and equivs[start] == equivs[i]:
                changed[start + 1] = 0
                start += 1
                changed[i + 1] = 1
                i += 1
                while changed[i + 1]:
                    i += 1
                j += 1
                while other[j + 1]:
                    corresponding = i
                    j += 1
            if runlength == i - start:
                break
        while corresponding < i:
            start -= 1
            changed[start + 1] = 1
            i -= 1
            changed[i + 1] = 0
            j -= 1
            while other[j + 1]:
                j -= 1


def analyze(old: Sequence[bytes], new: Sequence[bytes], total0: int, total1: int,
             budget: list[int] | None = None) -> tuple[bytearray, bytearray]:
    """Changed-line flags for one region, with a 0 sentinel at each end (line k at index k + 1)."""
    # The lines themselves are the equivalence classes (equal bytes, equal class; hashes are cached).
    eq0 = old if isinstance(old, list) else list(old)
    eq1 = new if isinstance(new, list) else list(new)
    keep0, keep1, ch0, ch1 = _discard_confusing(eq0, eq1, total0, total1)
    m = _Myers(eq0 if keep0 is None else list(compress(eq0, ch0.translate(_KEPT))),
               eq1 if keep1 is None else list(compress(eq1, ch1.translate(_KEPT))), budget)
    m.run()
    if m.xdel:
        real0 = None if keep0 is None else list(compress(range(len(eq0)), ch0.translate(_KEPT)))
        for x in m.xdel:
            ch0[x if real0 is None else real0[x]] = 1
    if m.yins:
        real1 = None if keep1 is None else list(compress(range(len(eq1)), ch1.translate(_KEPT)))
        for y in m.yins:
            ch1[y if real1 is None else real1[y]] = 1
    changed0 = bytearray(1) + ch0 + bytearray(1)
    changed1 = bytearray(1) + ch1 + bytearray(1)
    _shift_boundaries(eq0, changed0, changed1)
    _shift_boundaries(eq1, changed1, changed0)
    return changed0, changed1


def changes_of(changed0: bytearray, changed1: bytearray, base0: int, base1: int) -> list[Change]:
    """Runs of changes from the flag arrays (sentinel layout), offset to whole-file line numbers."""
    out: list[Change] = []
    n0, n1 = len(changed0) - 2, len(changed1) - 2
    i0 = i1 = 0
    while i0 < n0 or i1 < n1:
        if changed0[i0 + 1] or changed1[i1 + 1]:
            s0, s1 = i0, i1
            while i0 < n0 and changed0[i0 + 1]:
                i0 += 1
            while i1 < n1 and changed1[i1 + 1]:
                i1 += 1
            out.append(Change(base0 + s0, base1 + s1, i0 - s0, i1 - s1))
        else:
            # skip the stretch up to the next change of either file at C speed
            n0_next, n1_next = changed0.find(1, i0 + 1), changed1.find(1, i1 + 1)
            step = min((n0 + 1 if n0_next < 0 else n0_next) - 1 - i0, (n1 + 1 if n1_next < 0 else n1_next) - 1 - i1)
            step = max(step, 1)
            i0 += step
            i1 += step
    return out
