"""The broker process ``test_claude_code_crash.py`` SIGKILLs: a durable Broker whose default engine is
``claude-code`` (the real bundled CLI), its model requests through relay's endpoint to the parent's
``FakeAnthropic`` (which outlives this process).

It starts one run in mode ``full``, waits until the journal holds the intent of a ``Bash`` call with no
outcome and the command has started (its ``--started`` file exists), prints one JSON line
``{"run_id", "call_id", "pid"}`` and waits to be killed.

    RELAY_TEST_KEY=... python tests/runtime/claude_code_crash_broker.py --data-dir D --root R --base-url U \
        --conversation C --origin O --model M --started F
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from relay_jupyter.broker.assembly import install_components, start_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant


async def run(args: argparse.Namespace) -> None:
    broker = Broker.open(BrokerConfig(data_dir=Path(args.data_dir), default_model=args.model, consent_timeout=30,
                                      anthropic_api_key=os.environ["RELAY_TEST_KEY"], anthropic_base_url=args.base_url,
                                      default_engine="claude-code"))
    broker.grants.issue(Grant(origin=args.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                              consent_id="crash-test"))
    install_components(broker, jupyter_root=Path(args.root))
    await start_components(broker)
    caller = Caller(kind=CallerKind.KERNEL, origin=args.origin, client_id="kernel:crash")
    started = await call_method(broker, caller, "run.start", {
        "conversation": args.conversation, "prompt": "run the slow command", "mode": "full"})
    run_id = started["run_id"]
    marker = Path(args.started)
    async with asyncio.timeout(90):
        while True:
            row = broker.store.get_run(run_id)
            in_flight = [c for c in (row or {}).get("calls", []) if c["outcome"] is None and c["tool"] == "Bash"]
            if in_flight and marker.exists():
                break
            if row is not None and row["finished_at"] is not None:
                raise SystemExit(f"run ended before its tool call was in flight: {row['state']}")
            await asyncio.sleep(0.05)
    print(json.dumps({"run_id": run_id, "call_id": in_flight[0]["call_id"], "pid": os.getpid()}), flush=True)
    await asyncio.Event().wait()  # until the parent SIGKILLs this process


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    parser = argparse.ArgumentParser(description="broker child of the claude-code SIGKILL test")
    for name in ("data-dir", "root", "base-url", "conversation", "origin", "model", "started"):
        parser.add_argument(f"--{name}", required=True)
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
