"""The general ``unified_diff`` on large files with many changes (``core.diff._many_changes``: lines
compared at C speed, taken only when provably GNU's) against the real GNU ``diff -u``.

Each case is built to catch a wrong resynchronisation: lines repeated all over the file (where a
shifted comparison finds false matches), edits on the first and last lines, CRLF line ends, a last
line without a newline in either file, and lines inserted or deleted (the offset between the files
moving) as well as replaced one for one. The fast path must either give GNU's bytes or step aside;
the test also checks that it did not step aside every time (it would then test nothing new).
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from relay_jupyter.core import diff as diff_mod
from relay_jupyter.core.diff import EXACT_LIMIT, unified_diff, unified_diff_spans
from relay_jupyter.core.edit import Edit, apply_edits

pytestmark = pytest.mark.skipif(shutil.which("diff") is None, reason="GNU diff is needed")


def gnu(tmp: Path, old: bytes, new: bytes) -> bytes:
    (tmp / "o").write_bytes(old)
    (tmp / "n").write_bytes(new)
    return subprocess.run(["diff", "-u", "--label", "a", "--label", "b", str(tmp / "o"), str(tmp / "n")],
                          capture_output=True, check=False).stdout


@pytest.fixture
def taken(monkeypatch):
    """How often the fast path returned a diff (not None)."""
    seen = {"taken": 0, "declined": 0}
    real = diff_mod._many_changes

    def counting(*args):
        result = real(*args)
        seen["taken" if result is not None else "declined"] += 1
        return result

    monkeypatch.setattr(diff_mod, "_many_changes", counting)
    return seen


def _file(rng: random.Random, eol: bytes) -> list[bytes]:
    """About 320 KB of lines: mostly distinct, with a few lines repeated everywhere (blank lines,
    braces) the way code repeats them."""
    common = [b"", b"}", b"    return x", b"x = 1"]
    lines = []
    size = i = 0
    while size < EXACT_LIMIT // 2 + 40_000:
        line = rng.choice(common) if rng.random() < 0.3 else b"line %d %s" % (i, b"z" * rng.randint(0, 30))
        lines.append(line + eol)
        size += len(line) + len(eol)
        i += 1
    return lines


def _edit(rng: random.Random, lines: list[bytes], eol: bytes, count: int, shape: str,
          repeated: bool = True) -> list[bytes]:
    """``count`` edits far apart (and often the first and last lines): lines replaced one for one, or
    (``mixed``) also inserted and deleted; ``repeated``: the edits also touch and write repeated lines
    (GNU may then slide a change along equal neighbours, which the fast path must leave alone)."""
    out = list(lines)
    common = [b"", b"}", b"    return x", b"x = 1"]
    points = rng.sample(range(1, len(out) - 1), count)
    if rng.random() < 0.5:
        points += [len(out) - 1, 0]
    if not repeated:
        # edits at least 3 lines apart (GNU's choice between two nearer ones is not provable from
        # windows) of distinct lines only
        points = [k for k in points if not out[k].startswith((b"}", b" ", b"x", b"\r", b"\n"))
                  and not any(abs(k - q) < 3 for q in points if q != k)]
    for k in sorted(points, reverse=True):  # descending: indexes stay valid
        op = rng.random() if shape == "mixed" else 0.0
        pick = repeated and rng.random() < 0.2
        new_line = (rng.choice(common) if pick else b"EDIT %d" % rng.randrange(10**6)) + eol
        if op < 0.6:
            out[k] = new_line
        elif op < 0.8:
            out.insert(k, new_line)
        else:
            del out[k]
    return out


def _join(lines: list[bytes], eol: bytes, drop_last_eol: bool) -> bytes:
    data = b"".join(lines)
    return data[:-len(eol)] if drop_last_eol and data.endswith(eol) else data


@pytest.mark.parametrize("seed", range(12))
def test_many_changes_in_a_large_file_are_gnus(tmp_path: Path, taken, seed: int) -> None:
    rng = random.Random(seed)
    eol = b"\r\n" if seed % 3 == 1 else b"\n"
    lines = _file(rng, eol)
    shape = "replace" if seed % 2 == 0 else "mixed"
    new_lines = _edit(rng, lines, eol, rng.choice([70, 200, 900]), shape)
    old = _join(lines, eol, seed % 4 == 3)
    new = _join(new_lines, eol, seed % 5 == 2)
    assert len(old) + len(new) > EXACT_LIMIT
    assert unified_diff(old, new).text == gnu(tmp_path, old, new), f"seed {seed}"


def test_the_fast_path_is_taken_and_declines_what_it_cannot_prove(tmp_path: Path, taken) -> None:
    rng = random.Random(99)
    for seed in range(6):
        eol = b"\r\n" if seed == 1 else b"\n"
        lines = _file(rng, eol)
        new_lines = _edit(rng, lines, eol, 150, "replace" if seed % 2 == 0 else "mixed", repeated=False)
        old, new = _join(lines, eol, seed == 3), _join(new_lines, eol, seed == 4)
        assert unified_diff(old, new).text == gnu(tmp_path, old, new), f"case {seed}"
    assert taken["taken"] >= 3, taken
    # A file of a few lines repeated: a shifted comparison matches everywhere. Lines inserted and
    # deleted there leave GNU a choice between alignments that windows cannot prove: the fast path
    # must decline (or be right), and the result is GNU's either way.
    old = b"a\nb\n}\n\n" * 40_000
    cut = [old.find(b"\n", k) + 1 for k in range(1000, len(old) - 1000, 1600)]
    pieces, pos = [], 0
    for i, c in enumerate(cut):
        pieces += [old[pos:c], b"b\n" if i % 3 == 0 else b"NEW %d\n" % i]
        pos = c + (2 if i % 3 == 1 else 0)
    new = b"".join(pieces) + old[pos:]
    assert unified_diff(old, new).text == gnu(tmp_path, old, new)
    assert taken["declined"] >= 1, taken


def test_replace_all_through_the_edit_path_is_gnus(tmp_path: Path, taken) -> None:
    """``apply_edits`` (``unified_diff_spans`` with many spans) takes the same fast path."""
    lines = [(b"k = %d\r\n" % i) if i % 16 == 0 else (b"value %d " % i + b"y" * 28 + b"\r\n") for i in range(20_000)]
    old = b"".join(lines)[:-2]  # CRLF, and no line end after the last line
    out = apply_edits(old, [Edit("k = ", "key = ", replace_all=True)], path="f")
    assert out.diff.text == gnu(tmp_path, old, out.content).replace(b"--- a", b"--- a/f").replace(b"+++ b", b"+++ b/f")
    assert taken["taken"] >= 1
    # the last line changed, without a newline: GNU's marker
    old = b"".join(lines[:-1]) + b"k = last"
    new = old.replace(b"k = ", b"key = ")
    spans = []
    pos = old.find(b"k = ")
    while pos >= 0:
        spans.append((pos, pos + 4, 6))
        pos = old.find(b"k = ", pos + 4)
    assert unified_diff_spans(old, new, spans).text == gnu(tmp_path, old, new)
    assert unified_diff(old, new).text == gnu(tmp_path, old, new)


def test_line_changes_turn_one_file_into_the_other() -> None:
    """Whatever they are, the changes found are correct: applied to ``a`` they give ``b``."""
    rng = random.Random(5)
    vocab = [b"a", b"b", b"", b"}"]
    for _ in range(300):
        a = [rng.choice(vocab) if rng.random() < 0.7 else b"u%d" % rng.randrange(50) for _ in range(rng.randint(1, 400))]
        b = list(a)
        for _ in range(rng.randint(1, 30)):
            k = rng.randrange(len(b) + 1)
            r = rng.random()
            if r < 0.4 and k < len(b):
                b[k] = b"n%d" % rng.randrange(9)
            elif r < 0.7:
                b[k:k] = [rng.choice(vocab) for _ in range(rng.randint(1, 3))]
            else:
                del b[k:k + rng.randint(1, 3)]
        ch = diff_mod._line_changes(a, b)
        if ch is None:
            continue
        out, pos = [], 0
        for x, y, d, k in zip(ch.x, ch.y, ch.deleted, ch.inserted):
            assert x >= pos
            out += a[pos:x]
            assert len(out) == y
            out += b[y:y + k]
            pos = x + d
        out += a[pos:]
        assert out == b
