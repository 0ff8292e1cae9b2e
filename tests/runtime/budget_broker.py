"""One of the broker processes of the shared-budget test: a durable Broker on the given data dir
(shared with the other process), the runtime, and FakeAnthropic (in the parent) behind the real
Anthropic backend.

It touches ``<go>.<name>.ready``, waits until the file ``--go`` exists (so both processes start their runs together), starts
``--runs`` runs at once, each in its own conversation, waits for every one to end, and prints one
JSON line ``{"states": {run_id: state}}``.

    RELAY_TEST_KEY=... python tests/runtime/budget_broker.py --data-dir D --root R --base-url U \
        --origin O --model claude-test-1 --runs 10 --name a --go G
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.broker.assembly import install_components, start_components, stop_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind

KEY_ENV = "RELAY_TEST_KEY"


async def run(args: argparse.Namespace) -> dict[str, str]:
    """Start the runs together, wait for all of them, return their final states."""
    key = os.environ[KEY_ENV]
    empty_mcp = Path(args.root) / f"mcp-{args.name}.json"
    empty_mcp.write_text(json.dumps({"mcpServers": {}}))
    broker = Broker.open(BrokerConfig(data_dir=Path(args.data_dir), mcp_config_path=empty_mcp,
                                      default_model=args.model, consent_timeout=30,
                                      audit_file=f"audit-{args.name}.jsonl"))
    backend = AnthropicBackend(key, base_url=args.base_url, models=("claude-*",), timeout=60)
    install_components(broker, jupyter_root=Path(args.root), backends={"anthropic": backend})
    await start_components(broker)
    go = Path(args.go)
    Path(f"{go}.{args.name}.ready").touch()
    async with asyncio.timeout(60):
        while not go.exists():
            await asyncio.sleep(0.01)

    async def one(i: int) -> str:
        caller = Caller(kind=CallerKind.KERNEL, origin=args.origin, client_id=f"kernel:{args.name}{i}")
        started = await call_method(broker, caller, "run.start", {
            "conversation": f"conv-{args.name}-{i}", "prompt": f"client {args.name}{i}: say something",
            "mode": "full"})
        return started["run_id"]

    run_ids = await asyncio.gather(*(one(i) for i in range(args.runs)))
    states: dict[str, str] = {}
    async with asyncio.timeout(120):
        while len(states) < len(run_ids):
            for run_id in run_ids:
                row = broker.store.get_run(run_id)
                if row is not None and row["finished_at"] is not None:
                    states[run_id] = row["state"]
            await asyncio.sleep(0.02)
    await stop_components(broker)
    broker.close()
    return states


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run, print the states."""
    parser = argparse.ArgumentParser(description="broker child of the shared-budget test")
    for name in ("data-dir", "root", "base-url", "origin", "model", "name", "go"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--runs", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    states = asyncio.run(run(args))
    print(json.dumps({"states": states}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
