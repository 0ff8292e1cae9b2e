"""The exact (GNU) search has a work budget: past it, a diff is still produced, correct and applicable,
only possibly aligned differently from GNU's. Seed 1074 of the random run took 76 s before the budget."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

import relay_jupyter.core.diff as diff_mod
from relay_jupyter.core.diff import WorkExceeded, unified_diff, unified_diff_spans
from relay_jupyter.core.edit import Edit, apply_edits

from test_diff_gnu_random import patched

pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is needed")


def repetitive(n: int, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    return b"".join(rng.choice([b"a\n", b"b\n", b"}\n", b"x = 1\n"]) for _ in range(n))


def test_a_tiny_budget_stops_the_exact_search():
    old, new = repetitive(2000, seed=7), repetitive(2000, seed=8)
    with pytest.raises(WorkExceeded):
        unified_diff(old, new, budget=10)
    assert unified_diff(old, new).text  # no budget: exact, as before


@pytest.mark.parametrize("size", [3_000, 40_000])  # the whole-file path and the windowed path
def test_out_of_budget_diffs_still_apply(tmp_path: Path, monkeypatch, size: int):
    monkeypatch.setattr(diff_mod, "EXACT_STEPS", 50)
    if size > 10_000:
        monkeypatch.setattr(diff_mod, "EXACT_LIMIT", 1_000)
    old = repetitive(size)
    out = apply_edits(old, [Edit("a", "a\nb", replace_all=True)], path="f")
    assert patched(tmp_path, old, out.diff.text) == out.content
    rng = random.Random(3)
    spans = sorted({(p, p + 2) for p in (rng.randrange(0, len(old) - 2, 2) for _ in range(40))
                    if old[p:p + 2] in (b"a\n", b"b\n")})
    new = b"".join(old[(spans[i - 1][1] if i else 0):s] + b"zz\n" for i, (s, _e) in enumerate(spans))
    new += old[spans[-1][1]:]
    got = unified_diff_spans(old, new, [(s, e, 3) for s, e in spans], old_label="a/f", new_label="b/f")
    assert patched(tmp_path, old, got.text) == new
