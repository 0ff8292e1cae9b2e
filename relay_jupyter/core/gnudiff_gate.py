"""When a windowed diff is provably GNU's: the checks that decide between windows and a whole-region run.

GNU diff (analyze.c, diffutils 3.x) decides three things from the WHOLE compared region, not from the
lines around an edit:

* ``discard_confusing_lines`` marks a line 1 ("no match in the other file") or 2 ("more than MANY
  matches", MANY about 5 * sqrt(lines / 64)) from equivalence-class counts over the region, then keeps
  a 2 only inside a run of discards that starts and ends with 1s, and cancels every 2 of a run whose
  2s are more than a quarter of it (``length >> 2 < provisional``). A run can start in one edit
  window and run through thousands of repeated lines into the next one.
* ``compareseq``/``diag`` (gnulib diffseq.h) gives up on optimality once its cost reaches
  TOO_EXPENSIVE (4096 below 16M lines) and splits at the furthest-reaching diagonal, which depends on
  every edit of the region.
* ``shift_boundaries`` slides a run of changes while a neighbour equals its far end.

:func:`core.diff.unified_diff_spans` computes each edit window on its own and takes that result only
when these checks prove GNU would pick exactly it; otherwise it analyses the whole region (exact,
linear, slower). The checks are hand-written because they are statements about GNU's algorithm,
not something a library offers. The argument, for windows whose change is *simple* (the deleted and
inserted lines share no line and neither run can slide, see ``diff._simple_change``):

1. Context lines (identical in both files) always have a match in the other file, so they are never
   1s; a 2 among them survives only inside a run that reaches a 1 on each side, i.e. a run that
   crosses from one window's changed lines to the next one's. :func:`crossing_runs_cancel` proves
   every such run has more than a quarter of 2s, so GNU cancels all its 2s: no context line is
   discarded, and discarding changed lines cannot change which lines are changed.
2. With only changed lines discarded, the longest common subsequence is the identity on the context
   lines and it is unique (simple windows), so Myers' search returns it whatever its order, provided
   it never reaches TOO_EXPENSIVE: :func:`cost_bound_ok` bounds the edit cost by the changed lines.
3. No run can slide (simple windows), so ``shift_boundaries`` leaves the runs where they are.

The randomized comparison against the real GNU diff (``tests/core/test_diff_gnu_random.py``) checks
the argument, including on files made of a handful of lines repeated tens of thousands of times.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import add, gt, mul, sub

__all__ = ["TOO_EXPENSIVE", "cost_bound_ok", "crossing_blocks_cancel", "crossing_runs_cancel"]

#: GNU's floor for TOO_EXPENSIVE (analyze.c: MAX (4096, ~sqrt(diagonals))); the square-root term
#: exceeds it only past 4**12 diagonals (about 16M lines), where :func:`cost_bound_ok` refuses anyway.
TOO_EXPENSIVE = 4096
_MAX_LINES = 1 << 23


def crossing_runs_cancel(middles: Sequence[tuple[int, int]]) -> bool:
    """True when every run of discardable lines joining two changed blocks loses all its 2s.

    ``middles`` are one file's changed blocks as ``(first_line, line_count)``, sorted, non-empty,
    disjoint. A run from block ``a`` to block ``b`` holds at most ``sum(count[a..b])`` 1s and, if it
    crosses, every line of the stretches between the blocks as a 2; GNU cancels all its 2s when
    ``ones < 3 * twos``. Checked for every pair ``a < b`` in one pass (prefix sums, running maximum).
    """
    return crossing_blocks_cancel([first for first, _ in middles], [count for _, count in middles])


def crossing_blocks_cancel(firsts: Sequence[int], counts: Sequence[int]) -> bool:
    """:func:`crossing_runs_cancel` of the blocks ``zip(firsts, counts)``, over whole lists at C speed
    (``accumulate`` and ``map``: thousands of blocks in a ``replace_all``)."""
    if len(firsts) < 2:
        return True
    # With P_k = sum_{i<k} (3 * stretch_i - count_i), the condition for a < b is P_b - P_a - count_b > 0,
    # i.e. P_b - count_b > max(P_0 .. P_{b-1}) for every b >= 1.
    stretches = list(map(sub, firsts[1:], map(add, firsts[:-1], counts[:-1])))
    if 3 * min(stretches) > 2 * max(counts):
        # then every step of P is positive and larger than any count: the condition holds for all b
        return True
    p = list(accumulate(map(sub, map(mul, stretches, repeat(3)), counts[:-1]), initial=0))
    best = accumulate(p, max)
    return all(map(gt, map(sub, p[1:], counts[1:]), best))


def cost_bound_ok(changed_lines: int, region_lines: int) -> bool:
    """True when Myers' search over the region cannot reach TOO_EXPENSIVE.

    ``changed_lines`` bounds the edit cost D (deleted plus inserted lines left after discarding); the
    forward and backward searches meet by cost ceil(D / 2), checked before the cut-off at 4096.
    """
    return region_lines < _MAX_LINES and changed_lines < 2 * (TOO_EXPENSIVE - 2)
