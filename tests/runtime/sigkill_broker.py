"""The broker process the SIGKILL test kills: a durable Broker with the runtime, FakeAnthropic (in the
parent, so it outlives this process) behind the real Anthropic backend, and an MCP server whose
``hang`` tool never answers.

It starts one run in mode ``full`` (MCP tools are write-class by default; mode full lets them run
without a consent click), waits until the journal holds the intent of a ``--tool`` call with no
outcome, prints
one JSON line ``{"run_id", "call_id", "pid"}`` and then waits to be killed.

    RELAY_TEST_KEY=... python tests/runtime/sigkill_broker.py --data-dir D --root R --base-url U \
        --mcp-config M --conversation C --origin O --model claude-test-1 --tool notes__hang

``--recover-only D`` only starts a broker on ``D`` (crash repair) and exits (see :func:`recover_only`);
``--recover-many`` does that for each data dir it reads, each in a process of its own (:func:`recover_many`).
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
from relay_jupyter.broker.assembly import install_components, start_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant

KEY_ENV = "RELAY_TEST_KEY"
CLIENT_ID = "kernel:sigkill"


async def run(args: argparse.Namespace) -> None:
    """Start the run, report once its tool call is in flight, then wait forever (until SIGKILL)."""
    key = os.environ[KEY_ENV]
    broker = Broker.open(BrokerConfig(data_dir=Path(args.data_dir), mcp_config_path=Path(args.mcp_config),
                                      default_model=args.model, consent_timeout=30))
    broker.grants.issue(Grant(origin=args.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                              consent_id="sigkill-test"))
    backend = AnthropicBackend(key, base_url=args.base_url, models=("claude-*",), timeout=30)
    install_components(broker, jupyter_root=Path(args.root), backends={"anthropic": backend})
    await start_components(broker)
    caller = Caller(kind=CallerKind.KERNEL, origin=args.origin, client_id=CLIENT_ID)
    started = await call_method(broker, caller, "run.start", {
        "conversation": args.conversation, "prompt": "wait for the slow thing", "mode": "full"})
    run_id = started["run_id"]
    async with asyncio.timeout(600):  # a bound on a hang only: the parent waits for the line or the exit
        while True:
            row = broker.store.get_run(run_id)
            in_flight = [c for c in (row or {}).get("calls", [])
                         if c["outcome"] is None and c["tool"] == args.tool]
            if in_flight:
                break
            if row is not None and row["finished_at"] is not None:
                raise SystemExit(f"run ended before its tool call was in flight: {row['state']}")
            await asyncio.sleep(0.02)
    print(json.dumps({"run_id": run_id, "call_id": in_flight[0]["call_id"], "pid": os.getpid()}), flush=True)
    await asyncio.Event().wait()  # hold the call open until the parent SIGKILLs this process


def recover_only(data_dir: str) -> int:
    """``--recover-only D``: a broker start on ``D`` (its crash repair runs), then a clean exit.
    tests/runtime/test_crash_repair.py runs it with ``RELAY_TEST_CRASH_AT=recovery:N``."""
    from relay_jupyter.backends.demo import DemoBackend
    from relay_jupyter.broker.runtime_setup import install_runtime

    broker = Broker.open(BrokerConfig(data_dir=Path(data_dir)))
    try:
        ids = install_runtime(broker, {"demo": DemoBackend()}).recover()  # a second pass finds nothing
    finally:
        broker.close()
    print(json.dumps({"again": ids}), flush=True)
    return 0


def recover_many() -> int:
    """``--recover-many``: :func:`recover_only` for each line ``{"data_dir": D, "crash_at": "recovery:N" | null}``
    read from stdin, each in a child forked from this process (its imports done once: a fresh interpreter per
    broker start cost ~2 s of CPU, and the kill test starts two dozen). The child is a process of its own that
    the hook ends with ``os._exit`` (no cleanup) or that exits; then ``{"rc": its exit code}`` is printed.
    Nothing but imports runs here before a fork (no broker, no thread, no open database)."""
    import traceback

    from relay_jupyter.backends.demo import DemoBackend  # noqa: F401  (imported once, before the forks)
    from relay_jupyter.broker.runtime_setup import install_runtime  # noqa: F401

    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if job["crash_at"]:
                    os.environ["RELAY_TEST_CRASH_AT"] = job["crash_at"]
                code = recover_only(job["data_dir"])
            except BaseException:  # noqa: BLE001  (reported, then the child's own exit code)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run until killed."""
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if argv[:1] == ["--recover-only"]:
        return recover_only(argv[1])
    if argv[:1] == ["--recover-many"]:
        return recover_many()
    parser = argparse.ArgumentParser(description="broker child of the SIGKILL test")
    for name in ("data-dir", "root", "base-url", "mcp-config", "conversation", "origin", "model", "tool"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
