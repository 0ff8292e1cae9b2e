"""Diffs against GNU ``diff -u`` on the same inputs, measured in the same run (issue 18: fair baselines).

Two inputs, each an 8 MB, 200k-line file:

* ``3 edits``: three edits far apart (each replaces a line's start with two lines).
* ``replace_all``: ``replace_all`` touching 12.5k of the 200k lines.

Two paths of ours per input, each against GNU ``diff -u`` of the same old and new files:

* **general** ``core.diff.unified_diff(old, new)``: what the push card and ``workspace.diff`` (and
  ``relay.diff`` in a kernel) run. Like GNU it must find the changes. Target: at most 2x GNU.
* **scratch_edit** ``core.edit.apply_edits``: the edit tool's path, which knows the byte spans it
  replaced and diffs only around them (the edit itself included). It does less work than GNU by
  design, so its ratio is not a measure of the diff engine; it is kept separately as a watch
  (targets of issue 3: 0.5x and 5x).

Rounds are interleaved (ours, GNU, ours, GNU, ...) and the **median** of ``ROUNDS`` is reported.
GNU's time includes starting the process, which a caller running it would pay. Every output is
compared byte for byte with GNU's.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time

from relay_jupyter.core.diff import unified_diff
from relay_jupyter.core.edit import Edit, apply_edits

ROUNDS = 5


def _gnu(a: str, b: str) -> bytes:
    return subprocess.run(["diff", "-u", "--label", "a/data.txt", "--label", "b/data.txt", a, b],
                          capture_output=True, check=False).stdout


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _case(report, name: str, tmp: str, old: bytes, edits: list[Edit], target_general: float,
          target_edit: float) -> None:
    new = apply_edits(old, edits, path="data.txt").content
    a, b = os.path.join(tmp, "old"), os.path.join(tmp, "new")
    with open(a, "wb") as fh:
        fh.write(old)
    with open(b, "wb") as fh:
        fh.write(new)
    general, edit, gnu = [], [], []
    for _ in range(ROUNDS):
        t, out = _timed(lambda: unified_diff(old, new, old_label="a/data.txt", new_label="b/data.txt"))
        general.append(t)
        t, gnu_text = _timed(lambda: _gnu(a, b))
        gnu.append(t)
        t, result = _timed(lambda: apply_edits(old, edits, path="data.txt"))
        edit.append(t)
        if out.text != gnu_text or result.diff.text != gnu_text:
            raise AssertionError(f"{name}: a diff differs from GNU diff -u")
    g = statistics.median(gnu) * 1000
    report(f"general unified_diff, {name}", statistics.median(general) * 1000, g, "ms", target=target_general)
    report(f"scratch_edit (apply_edits: edit + diff of known spans), {name}", statistics.median(edit) * 1000, g,
           "ms", target=target_edit)


def run(report) -> None:
    """Run both inputs; ``report(name, value, baseline, unit, target=None)``."""
    if shutil.which("diff") is None:
        raise RuntimeError("GNU diff is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        lines = [f"line {i:06d} " + "x" * 28 + "\n" for i in range(200_000)]
        old = "".join(lines).encode()
        edits = [Edit(f"line {i:06d} ", f"LINE {i:06d} changed\nextra line\n") for i in (1000, 100_000, 190_000)]
        _case(report, "8 MB / 3 edits", tmp, old, edits, 2.0, 0.5)
        lines = [(f"k = {i}\n" if i % 16 == 0 else f"value {i} " + "y" * 28 + "\n") for i in range(200_000)]
        old = "".join(lines).encode()
        _case(report, "8 MB / replace_all 12.5k lines", tmp, old, [Edit("k = ", "key = ", replace_all=True)],
              2.0, 5.0)


if __name__ == "__main__":  # pragma: no cover - manual run
    def _print(name, value, baseline, unit, target=None):
        ratio = value / baseline
        flag = "" if target is None else (" ok" if ratio <= target else " OVER")
        print(f"{name}: {value:.1f} {unit} vs {baseline:.1f} {unit} = {ratio:.2f}x (target {target}){flag} "
              f"load {os.getloadavg()[0]:.2f}")

    run(_print)
