"""scratch_edit vs GNU ``diff -u`` on the same files, measured in the same run.

* ``edit_3_of_200k``: an 8 MB, 200k-line file with 3 edits: our edit plus diff, against GNU
  ``diff -u`` of the old and new files (target: at most 0.5x).
* ``replace_all_12k``: ``replace_all`` touching 12.5k of 200k lines, against GNU ``diff -u``
  (target: at most 5x).

Both sides are timed best-of-N to damp noise from a shared machine; GNU's time includes starting
the process, which is what a caller running it would pay. The outputs are compared byte for byte.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable

from relay_jupyter.core.edit import Edit, apply_edits

_ROUNDS = 7


def _best(fn: Callable[[], object], rounds: int = _ROUNDS) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _gnu(tmp: str, old: bytes, new: bytes) -> tuple[float, bytes]:
    a, b = os.path.join(tmp, "old"), os.path.join(tmp, "new")
    with open(a, "wb") as fh:
        fh.write(old)
    with open(b, "wb") as fh:
        fh.write(new)
    cmd = ["diff", "-u", "--label", "a/data.txt", "--label", "b/data.txt", a, b]
    out: list[bytes] = []

    def run() -> None:
        out.append(subprocess.run(cmd, capture_output=True, check=False).stdout)

    return _best(run), out[-1]


def _case(report, name: str, tmp: str, old: bytes, edits: list[Edit], target: float) -> None:
    result = apply_edits(old, edits, path="data.txt")
    ours = _best(lambda: apply_edits(old, edits, path="data.txt"))
    gnu, gnu_text = _gnu(tmp, old, result.content)
    if gnu_text != result.diff.text:
        raise AssertionError(f"{name}: diff differs from GNU diff -u")
    report(name, ours * 1000, gnu * 1000, "ms", target=target)


def run(report) -> None:
    """Run both cases; ``report(name, value, baseline, unit, target=None)``."""
    if shutil.which("diff") is None:
        raise RuntimeError("GNU diff is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        lines = [f"line {i:06d} " + "x" * 28 + "\n" for i in range(200_000)]
        old = "".join(lines).encode()
        edits = [Edit(f"line {i:06d} ", f"LINE {i:06d} changed\nextra line\n") for i in (1000, 100_000, 190_000)]
        _case(report, "edit_3_of_200k", tmp, old, edits, 0.5)
        lines = [(f"k = {i}\n" if i % 16 == 0 else f"value {i} " + "y" * 28 + "\n") for i in range(200_000)]
        old = "".join(lines).encode()
        _case(report, "replace_all_12k", tmp, old, [Edit("k = ", "key = ", replace_all=True)], 5.0)


if __name__ == "__main__":  # pragma: no cover - manual run
    def _print(name, value, baseline, unit, target=None):
        ratio = value / baseline
        flag = "" if target is None else (" ok" if ratio <= target else " OVER")
        print(f"{name}: {value:.1f} {unit} vs {baseline:.1f} {unit} = {ratio:.2f}x (target {target}){flag}")

    run(_print)
