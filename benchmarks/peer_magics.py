"""Side by side in real kernels: ``%%agent`` vs the direct anthropic SDK vs jupyter-ai's ``%%ai`` (2.x, 3.x).

    .venv/bin/python benchmarks/peer_magics.py                 # 4 interleaved rounds (about 4.5 minutes)
    .venv/bin/python benchmarks/peer_magics.py --rounds 2 --variants sdk,agent --json out.json

Every variant gets the same paced answer (600 tokens, first at 0.1 s, then 100 tokens/s) from one
fake Anthropic server on 127.0.0.1 (``benchmarks/peers/fake.py``). Each round starts a fresh kernel
per variant, in a rotating order, and runs two cells in it:

- the load cell: ``import anthropic`` and the client built once (sdk), ``%load_ext relay_jupyter`` (agent), ``%load_ext
  jupyter_ai_magics`` (v2), ``%load_ext jupyter_ai_magic_commands`` (v3);
- the answer cell: a ``messages.stream`` loop printing each text delta (sdk), ``%%agent`` (agent), ``%%ai
  anthropic-chat:MODEL -m {"base_url":...}`` (v2), ``%%ai anthropic/MODEL --api-base ...`` (v3).

Every iopub message is timestamped as it arrives. Reported per variant (median, min-max): load time
(request sent -> kernel idle), first answer text visible (first output message carrying the answer's
first word), cell finished (-> kernel idle), number and bytes of iopub output messages; each as a ratio
to the direct SDK in the same run. The peers run in their own venvs under ``benchmarks/.peers/``
(installed on first use); the agent talks to a Jupyter server running the relay extension.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers.fake import ANSWER, API_KEY, MARKER, MODEL, PROMPT, V2_MODEL, PacedFake, short_reply
from peers.kernels import CellRun, Kernel, write_kernelspec
from peers.relay_server import RelayServer
from peers.venvs import PEERS, ensure

VARIANTS = ("sdk", "agent", "v2", "v3")
LABELS = {"sdk": "direct SDK stream", "agent": "relay %%agent", "v2": "jupyter-ai 2.x %%ai",
          "v3": "jupyter-ai 3.x %%ai"}
METRICS = (("load", "load (s)"), ("request", "request at model (s)"), ("first", "first text (s)"),
           ("cell", "cell done (s)"),
           ("outputs", "iopub outputs"), ("bytes", "iopub bytes"), ("second", "2nd cell first text (s)"),
           ("ready", "load + first text (s)"))


@dataclass
class Variant:
    name: str
    load: str
    cell: str
    kernelspec: str | None = None
    """None: the kernel is started by the relay Jupyter server."""


@dataclass
class Sample:
    load: float
    request: float
    """Cell sent -> the model request reached the fake (what happens before the model is asked)."""
    first: float
    cell: float
    outputs: int
    bytes: int
    second: float
    """First text of the same cell run again in the same kernel (a two-word answer)."""

    @property
    def ready(self) -> float:
        """A fresh kernel to the first answer text: the load cell plus the first answer cell's first text."""
        return self.load + self.first


@dataclass
class Attempt:
    """The cells of one fresh kernel."""

    load: CellRun
    cell: CellRun | None = None
    request: float | None = None
    second: CellRun | None = None


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    failures: dict[str, list[str]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    cold: dict[str, float | None] | None = None
    """The agent's first run after the server started (warm-up, not in the table)."""


def variants(base_url: str) -> dict[str, Variant]:
    """The load and answer cells of each variant, pointed at the fake at ``base_url``."""
    # The SDK's client is built once, in the load cell, as a user would (issue 18: building it inside
    # the timed cell charged the SDK ~0.1 s the broker's warm client never pays).
    sdk_load = ("import anthropic\n"
                f"client = anthropic.Anthropic(api_key={API_KEY!r}, base_url={base_url!r}, max_retries=0)")
    sdk_cell = (
        f"with client.messages.stream(model={MODEL!r}, max_tokens=2048,\n"
        f"                            messages=[{{'role': 'user', 'content': {PROMPT!r}}}]) as stream:\n"
        "    for text in stream.text_stream:\n"
        "        print(text, end='', flush=True)\n")
    return {
        "sdk": Variant("sdk", sdk_load, sdk_cell, kernelspec="relay-bench-ours"),
        # --new: a fresh conversation per cell. Without it the kernel names its conversation "default",
        # and the broker refuses a second notebook's "default" (conversation ids are not per origin):
        # every round after the first would fail with NOT_FOUND (reported; see benchmarks/README.md)
        "agent": Variant("agent", "%load_ext relay_jupyter", f"%%agent --new --model {MODEL}\n{PROMPT}"),
        "v2": Variant("v2", f"%load_ext {PEERS['v2'].extension}",
                      f'%%ai anthropic-chat:{V2_MODEL} -m {{"base_url":"{base_url}"}}\n{PROMPT}',
                      kernelspec="relay-bench-v2"),
        "v3": Variant("v3", f"%load_ext {PEERS['v3'].extension}",
                      f"%%ai anthropic/{MODEL} --api-base {base_url}\n{PROMPT}", kernelspec="relay-bench-v3"),
    }


def kernel_env() -> dict[str, str]:
    """Environment of the directly launched kernels (sdk, v2, v3): the fake's key for the SDKs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "VIRTUAL_ENV"))}
    env["ANTHROPIC_API_KEY"] = API_KEY
    # litellm (v3) otherwise fetches its model price map from GitHub at import; offline that only adds
    # a timeout, which would charge v3 for this machine's network rather than for its code
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return env


class Bench:
    def __init__(self, selected: list[str], work: Path, log=print) -> None:
        self.selected = selected
        self.work = work
        self.log = log
        self.fake = PacedFake().start()
        self.cells = variants(self.fake.base_url)
        self.server: RelayServer | None = None
        self.env = kernel_env()
        self.counter = 0
        pythons = {"relay-bench-ours": Path(sys.executable)}
        for name in ("v2", "v3"):
            if name in selected:
                pythons[f"relay-bench-{name}"] = ensure(PEERS[name], log=log)
        for spec, python in pythons.items():
            write_kernelspec(work / "specs", spec, python)
        if "agent" in selected:
            self.server = RelayServer(work / "relay", anthropic_base_url=self.fake.base_url, api_key=API_KEY,
                                      model=MODEL).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.fake.stop()

    async def _kernel(self, variant: Variant) -> tuple[Kernel, str | None]:
        if variant.kernelspec is not None:
            cwd = self.work / "cwd"
            cwd.mkdir(exist_ok=True)
            return await Kernel.launch(self.work / "specs", variant.kernelspec, self.env, cwd), None
        assert self.server is not None
        self.counter += 1
        # a fresh notebook path per kernel, so every round starts with no conversation history
        session_id, _, connection = await asyncio.to_thread(self.server.open_notebook, f"bench-{self.counter}.ipynb")
        return await Kernel.attach(connection), session_id

    def model_request_at(self, since: int) -> float | None:
        """``received_at`` (monotonic) of the first model request after the ``since``-th one."""
        for record in self.fake.requests[since:]:
            if record.method == "POST" and record.path.rstrip("/") == "/v1/messages":
                return record.received_at
        return None

    async def once(self, name: str, *, answer: bool = True) -> Attempt:
        """A fresh kernel for ``name``: the load cell, then (when ``answer``) the answer cell and the same
        cell again with a two-word answer (the per-cell cost once the kernel is warm)."""
        variant = self.cells[name]
        kernel, session_id = await self._kernel(variant)
        try:
            attempt = Attempt(await kernel.execute(variant.load, timeout=120))
            if not answer or attempt.load.status != "ok":
                return attempt
            seen = len(self.fake.requests)
            attempt.cell = await kernel.execute(variant.cell, timeout=120)
            at = self.model_request_at(seen)
            attempt.request = None if at is None else at - attempt.cell.sent
            if attempt.cell.status == "ok":
                self.fake.queue_next(short_reply())
                attempt.second = await kernel.execute(variant.cell, timeout=60)
            return attempt
        finally:
            await kernel.close()
            if session_id is not None and self.server is not None:
                await asyncio.to_thread(self.server.close_notebook, session_id)

    async def round(self, index: int, results: Results) -> None:
        k = index % len(self.selected)
        for name in self.selected[k:] + self.selected[:k]:  # rotate: no variant always goes first
            try:
                attempt = await self.once(name)
            except Exception as exc:  # noqa: BLE001 - a kernel that died or hung: record it, measure the rest
                results.failures[name].append(f"{type(exc).__name__}: {exc}")
                self.log(f"  round {index + 1} {name}: {type(exc).__name__}: {exc}")
                continue
            load, cell, request, second = attempt.load, attempt.cell, attempt.request, attempt.second
            problem = None
            if load.status != "ok":
                problem = f"load cell failed: {load.error_text()}"
            elif cell is None or cell.status != "ok":
                problem = f"answer cell failed: {cell.error_text() if cell else '?'}"
            elif cell.first_containing(MARKER) is None or request is None:
                problem = f"the answer never appeared: {cell.error_text()}"
            elif second is None or second.first_containing(MARKER) is None:
                problem = f"the second cell's answer never appeared: {second.error_text() if second else '?'}"
            if problem:
                results.failures[name].append(problem)
                self.log(f"  round {index + 1} {name}: {problem[:300]}")
                continue
            assert cell is not None
            first = cell.first_containing(MARKER)
            again = second.first_containing(MARKER) if second else None
            assert first is not None and request is not None and again is not None
            sample = Sample(load.elapsed(), request, first, cell.elapsed(), len(cell.outputs()), cell.output_bytes(),
                            again)
            results.samples[name].append(sample)
            self.log(f"  round {index + 1} {name}: load {sample.load:.3f} s, model request {sample.request:.3f} s, "
                     f"first text {sample.first:.3f} s, "
                     f"done {sample.cell:.3f} s, {sample.outputs} outputs, {sample.bytes} B, "
                     f"second cell first text {sample.second:.3f} s")

    async def warm(self, results: Results) -> None:
        """Start each variant's kernel and load cell once, unmeasured (disk caches, bytecode). The agent
        also runs its answer cell once: the broker lives as long as the Jupyter server, so its first run
        after start (backend client, imports) is a one-time cost, kept as ``results.cold``."""
        for name in self.selected:
            try:
                attempt = await self.once(name, answer=name == "agent")
            except Exception as exc:  # noqa: BLE001 - the measured rounds report it again
                self.log(f"  warm-up {name}: {type(exc).__name__}: {exc}")
                continue
            load, cell = attempt.load, attempt.cell
            if load.status != "ok":
                self.log(f"  warm-up {name}: load cell failed: {load.error_text()[:300]}")
            elif cell is not None and cell.status == "ok":
                results.cold = {"request": attempt.request, "first": cell.first_containing(MARKER),
                                "cell": cell.elapsed()}


def _stats(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def summarize(results: Results) -> dict[str, dict[str, Any]]:
    """Per variant and metric: median, min, max, and the ratio of medians to the SDK's."""
    out: dict[str, dict[str, Any]] = {}
    base = results.samples.get("sdk") or []
    for name, samples in results.samples.items():
        if not samples:
            continue
        row: dict[str, Any] = {"rounds": len(samples)}
        for key, _ in METRICS:
            med, lo, hi = _stats([getattr(s, key) for s in samples])
            ratio = None
            if base:
                b = statistics.median([getattr(s, key) for s in base])
                ratio = med / b if b else None
            row[key] = {"median": med, "min": lo, "max": hi, "ratio_to_sdk": ratio}
        out[name] = row
    return out


def _fmt(key: str, cell: dict[str, Any]) -> str:
    if key in ("outputs", "bytes"):
        text = f"{cell['median']:,.0f} ({cell['min']:,.0f}–{cell['max']:,.0f})"
    else:
        text = f"{cell['median']:.3f} ({cell['min']:.3f}–{cell['max']:.3f})"
    if cell["ratio_to_sdk"] is not None:
        text += f" **{cell['ratio_to_sdk']:.2f}×**"
    return text


def table(summary: dict[str, dict[str, Any]]) -> str:
    """The Markdown table of :func:`summarize`."""
    head = "| variant | rounds | " + " | ".join(label for _, label in METRICS) + " |"
    lines = [head, "|" + " --- |" * (len(METRICS) + 2)]
    for name in VARIANTS:
        if name in summary:
            row = summary[name]
            lines.append(f"| {LABELS[name]} | {row['rounds']} | "
                         + " | ".join(_fmt(k, row[k]) for k, _ in METRICS) + " |")
    return "\n".join(lines)


def targets(summary: dict[str, dict[str, Any]]) -> list[tuple[str, float, float, float]]:
    """The issue's targets as (name, value, baseline, max ratio), for those that could be measured."""
    out = []
    agent = summary.get("agent")
    if agent and "sdk" in summary:
        out.append(("%%agent first text vs a warm direct SDK client", agent["first"]["median"],
                    summary["sdk"]["first"]["median"], 1.05))
    if agent and "v2" in summary:
        out.append(("%load_ext relay_jupyter vs jupyter_ai_magics", agent["load"]["median"],
                    summary["v2"]["load"]["median"], 0.25))
    if agent:
        out.append(("%%agent iopub bytes vs the answer's bytes", agent["bytes"]["median"],
                    float(len(ANSWER.encode())), 3.0))
    return out


def measure(rounds: int, selected: list[str], log=print, warmup: bool = True) -> tuple[dict[str, Any], Results]:
    """Run the benchmark; returns (summary, raw results)."""
    results = Results()
    with tempfile.TemporaryDirectory(prefix="relay-peer-bench-") as tmp:
        bench = Bench(selected, Path(tmp), log=log)
        try:
            async def main() -> None:
                if warmup:
                    log("warm-up: each kernel and load cell once, the agent's first broker run (not counted)")
                    await bench.warm(results)
                for i in range(rounds):
                    log(f"round {i + 1}/{rounds}")
                    await bench.round(i, results)

            asyncio.run(main())
        finally:
            bench.close()
    return summarize(results), results


def run(report) -> None:
    """For ``benchmarks/run.py``-style reporting: two rounds, the issue's three targets."""
    summary, _ = measure(2, list(VARIANTS), log=lambda *_: None)
    for name, value, baseline, target in targets(summary):
        unit = "B" if "bytes" in name else "s"
        report(name, value, baseline, unit, target=target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4, about 4.5 minutes)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    parser.add_argument("--no-warmup", action="store_true", help="skip the unmeasured warm-up of each kernel")
    parser.add_argument("--json", type=Path, help="also write the summary and failures as JSON")
    args = parser.parse_args(argv)
    selected = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(selected) - set(VARIANTS)
    if unknown or not selected or args.rounds < 1:
        parser.error(f"--variants takes some of {','.join(VARIANTS)}; --rounds >= 1")
    print(f"answer: {len(ANSWER.split())} tokens, {len(ANSWER.encode())} bytes; model {MODEL}", flush=True)
    summary, results = measure(args.rounds, selected, log=lambda *a: print(*a, flush=True),
                               warmup=not args.no_warmup)
    print()
    print(table(summary))
    print()
    if results.cold and results.cold.get("first") is not None:
        c = results.cold
        print(f"agent, first run after the server started (warm-up, not in the table): model request "
              f"{c['request'] or 0:.3f} s, first text {c['first']:.3f} s, cell done {c['cell']:.3f} s")
    for name, value, baseline, target in targets(summary):
        ratio = value / baseline if baseline else float("inf")
        print(f"target: {name}: {value:.4g} / {baseline:.4g} = {ratio:.2f}× (max {target}×) "
              f"{'ok' if ratio <= target else 'MISSED'}")
    for name, problems in results.failures.items():
        if problems:
            print(f"FAILED {LABELS[name]}: {len(problems)} of {args.rounds} rounds; first: {problems[0][:500]}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "failures": results.failures,
                                         "answer_bytes": len(ANSWER.encode()),
                                         "agent_cold": results.cold}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
