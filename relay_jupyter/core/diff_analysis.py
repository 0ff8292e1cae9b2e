"""GNU diff's analysis of one region, ported: the "confusing lines" discard pass, Myers' O(ND)
middle-snake search with GNU's "too expensive" cut-off, and the boundary-shifting canonicalisation.

Hand-written because no library reproduces GNU's choices (difflib aligns differently); written from the
description of GNU diffutils' ``analyze.c`` so that :mod:`relay_jupyter.core.diff` can emit hunks that are
byte-identical to ``diff -u``. Split from ``core/diff.py``, which formats hunks and windows large files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Change", "WorkExceeded", "analyze", "changes_of"]


@dataclass(frozen=True)
class Change:
    """One run of changed lines: ``deleted`` old lines at ``line0`` became ``inserted`` new lines at ``line1``.

    Line numbers are 0-based indexes into the whole old / new file.
    """

    line0: int
    line1: int
    deleted: int
    inserted: int




def _discard_confusing(eq0: list[int], eq1: list[int], n_total0: int, n_total1: int
                       ) -> tuple[list[int], list[int], bytearray, bytearray]:
    """Drop lines that cannot match (and provisionally, lines that match too often) before Myers.

    Returns (real indexes kept in file 0, in file 1, changed0, changed1) with discarded lines marked.
    ``n_total*`` is the size of the whole compared region, which sets the "too many matches" bar.
    """
    count0: dict[int, int] = {}
    count1: dict[int, int] = {}
    for e in eq0:
        count0[e] = count0.get(e, 0) + 1
    for e in eq1:
        count1[e] = count1.get(e, 0) + 1
    result = []
    for equivs, other, total in ((eq0, count1, n_total0), (eq1, count0, n_total1)):
        end = len(equivs)
        many = 5
        tem = total // 64
        while True:
            tem >>= 2
            if tem <= 0:
                break
            many *= 2
        disc = bytearray(end)
        for i, e in enumerate(equivs):
            nmatch = other.get(e, 0)
            if nmatch == 0:
                disc[i] = 1
            elif nmatch > many:
                disc[i] = 2
        _settle_provisional(disc)
        result.append(disc)
    changed0 = bytearray(len(eq0))
    changed1 = bytearray(len(eq1))
    keep0 = [i for i, d in enumerate(result[0]) if d == 0]
    keep1 = [i for i, d in enumerate(result[1]) if d == 0]
    for i, d in enumerate(result[0]):
        if d:
            changed0[i] = 1
    for i, d in enumerate(result[1]):
        if d:
            changed1[i] = 1
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
                while x < xlim and y < ylim and xv[x] == yv[y]:
                    x += 1
                    y += 1
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
                while xoff < x and yoff < y and xv[x - 1] == yv[y - 1]:
                    x -= 1
                    y -= 1
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
            while xoff < xlim and yoff < ylim and xv[xoff] == yv[yoff]:
                xoff += 1
                yoff += 1
            while xoff < xlim and yoff < ylim and xv[xlim - 1] == yv[ylim - 1]:
                xlim -= 1
                ylim -= 1
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
    classes: dict[bytes, int] = {}
    eq0 = [classes.setdefault(line, len(classes) + 1) for line in old]
    eq1 = [classes.setdefault(line, len(classes) + 1) for line in new]
    keep0, keep1, ch0, ch1 = _discard_confusing(eq0, eq1, total0, total1)
    m = _Myers([eq0[i] for i in keep0], [eq1[i] for i in keep1], budget)
    m.run()
    for x in m.xdel:
        ch0[keep0[x]] = 1
    for y in m.yins:
        ch1[keep1[y]] = 1
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
            i0 += 1
            i1 += 1
    return out
