"""Run the benchmarks and print each figure as a ratio against a baseline measured in the same run.

Usage::

    .venv/bin/python benchmarks/run.py              # every benchmarks/bench_*.py
    .venv/bin/python benchmarks/run.py gate events  # bench_gate.py and bench_events.py only
    .venv/bin/python benchmarks/run.py --json out.json --strict

Each ``bench_<area>.py`` exposes ``run(report) -> None`` and calls
``report(name, value, baseline, unit, target=None)`` once per figure: ``value`` and ``baseline`` in
``unit`` (lower is better), ``target`` the largest acceptable ``value / baseline`` ratio. The runner
is reporting only: it exits 0 unless ``--strict`` is given and a target is missed (or a benchmark
crashed). Timing assertions never go into tests; they live here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass
class Row:
    bench: str
    name: str
    value: float
    baseline: float
    unit: str
    target: float | None
    load: float = 0.0
    """1-minute load average (``os.getloadavg``) when the figure was reported."""

    @property
    def ratio(self) -> float:
        if self.baseline > 0:
            return self.value / self.baseline
        return math.inf if self.value > 0 else 1.0

    @property
    def ok(self) -> bool | None:
        return None if self.target is None else self.ratio <= self.target


def discover(names: list[str]) -> list[Path]:
    """The benchmark files to run: all ``bench_*.py``, or those named (``gate`` or ``bench_gate``)."""
    found = sorted(HERE.glob("bench_*.py"))
    if not names:
        return found
    by_name = {p.stem.removeprefix("bench_"): p for p in found}
    out = []
    for n in names:
        key = Path(n).stem.removeprefix("bench_")
        if key not in by_name:
            raise SystemExit(f"no benchmark named {n!r}; have: {', '.join(sorted(by_name)) or 'none'}")
        out.append(by_name[key])
    return out


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"relay_bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise TypeError(f"{path.name} has no run(report) function")
    return module


def _fmt(x: float) -> str:
    if x == 0 or math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def print_table(rows: list[Row], out=sys.stdout) -> None:
    header = ["benchmark", "name", "value", "baseline", "ratio", "target", "ok", "load"]
    cells = [[r.bench, r.name, f"{_fmt(r.value)} {r.unit}", f"{_fmt(r.baseline)} {r.unit}", f"{r.ratio:.2f}×",
              "" if r.target is None else f"≤ {r.target:.2f}×",
              "" if r.ok is None else ("yes" if r.ok else "NO"), f"{r.load:.1f}"] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(header)]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(line, file=out)
    print("-+-".join("-" * w for w in widths), file=out)
    for c in cells:
        print(" | ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)), file=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed or a benchmark fails")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

    rows: list[Row] = []
    failed: list[str] = []
    for path in discover(args.names):
        bench = path.stem.removeprefix("bench_")

        def report(name: str, value: float, baseline: float, unit: str, target: float | None = None,
                   _bench: str = bench) -> None:
            rows.append(Row(_bench, name, float(value), float(baseline), unit, target, os.getloadavg()[0]))

        t0 = time.perf_counter()
        print(f"[{bench}] start, load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"on {os.cpu_count()} cores", file=sys.stderr)
        try:
            load(path).run(report)
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others' figures
            failed.append(bench)
            print(f"[{bench}] FAILED:\n{traceback.format_exc()}", file=sys.stderr)
        print(f"[{bench}] {time.perf_counter() - t0:.1f}s, load average {os.getloadavg()[0]:.2f}", file=sys.stderr)

    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "ratio": r.ratio, "ok": r.ok} for r in rows],
                                              indent=2))
    missed = [r for r in rows if r.ok is False]
    if args.strict and (missed or failed):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
