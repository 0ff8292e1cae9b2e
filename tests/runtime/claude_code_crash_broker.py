"""The broker process ``test_claude_code_crash.py`` SIGKILLs: a durable Broker whose default engine is
``claude-code`` (the real bundled CLI), its model requests through relay's endpoint to the parent's
``FakeAnthropic`` (which outlives this process).

It starts one run in mode ``full``, waits until the journal holds the intent of a ``--tool`` call (default
``Bash``) with no outcome and the command has started (its ``--started`` file exists; not asked for an MCP
tool), prints one JSON line ``{"run_id", "call_id", "pid"}`` and waits to be killed. ``--mcp-dir D``: the
shipped test MCP server (over stdio, notes in ``D``) is the user's MCP server ``t``.

    RELAY_TEST_KEY=... python tests/runtime/claude_code_crash_broker.py --data-dir D --root R --base-url U \
        --conversation C --origin O --model M --started F [--tool t__hang --mcp-dir N]
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
    mcp: dict = {}
    if args.mcp_dir:
        config = Path(args.data_dir).parent / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"t": {
            "command": sys.executable, "args": ["-m", "relay_jupyter.testing.mcp_server", "--dir", args.mcp_dir]}}}))
        mcp = {"mcp_config_path": config}
    broker = Broker.open(BrokerConfig(data_dir=Path(args.data_dir), default_model=args.model, consent_timeout=30,
                                      anthropic_api_key=os.environ["RELAY_TEST_KEY"], anthropic_base_url=args.base_url,
                                      default_engine="claude-code", **mcp))
    broker.grants.issue(Grant(origin=args.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                              consent_id="crash-test"))
    install_components(broker, jupyter_root=Path(args.root))
    await start_components(broker)
    if args.mcp_dir:
        async with asyncio.timeout(60):  # the MCP server listed its tools
            while broker.mcp.spec(args.tool) is None:
                await asyncio.sleep(0.1)
    caller = Caller(kind=CallerKind.KERNEL, origin=args.origin, client_id="kernel:crash")
    started = await call_method(broker, caller, "run.start", {
        "conversation": args.conversation, "prompt": "run the slow command", "mode": "full"})
    run_id = started["run_id"]
    marker = Path(args.started)
    async with asyncio.timeout(90):
        while True:
            row = broker.store.get_run(run_id)
            in_flight = [c for c in (row or {}).get("calls", []) if c["outcome"] is None and c["tool"] == args.tool]
            if in_flight and (args.mcp_dir or marker.exists()):
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
    parser.add_argument("--tool", default="Bash")
    parser.add_argument("--mcp-dir", default="")
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
