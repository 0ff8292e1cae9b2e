"""A kernel's origin on the daemon is the one the daemon bound to the credential it issued (issue 19 item 4).

The kernel registers once (``POST /relay/kernel``); on the Unix socket the daemon reads the notebook from the
*peer process* (its start-up environment, its runner's command line), never from what the kernel says. As an
attacker: a kernel of notebook A that names notebook B — in its registration claim, in ``X-Relay-Client``, or
in a credential it edits — cannot use B's grant or spend B's budget. Over TCP the
daemon finds the peer process of a loopback connection through ``/proc/net/tcp`` and reads it the same way; the
reserved names, the bearer token and the MAC hold there too.

Real parts: ``jupyter relay serve`` (demo backend) and kernel-side code (``kernel/discovery.py`` and
``RelayClient``) in processes of their own, each with the environment a runner would give its kernel."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_harness import env_for, one_shot, run_cli, start_daemon

from relay_jupyter.protocol.client_names import client_name_for

pytestmark = pytest.mark.slow

#: A kernel process: register (claiming CLAIM), then call the broker as that kernel; print what it saw.
KERNEL = r"""
import asyncio, json, os, sys
from relay_jupyter.kernel.client import Endpoint, RelayClient
from relay_jupyter.kernel.discovery import discover
from relay_jupyter.kernel.errors import RpcError

async def main():
    claim = os.environ.get("CLAIM") or None
    endpoint = await discover(client_name="kernel:whatever", start_daemon=False, notebook=claim)
    registered = "daemon:" + endpoint.client_name  # what the daemon answered at registration
    if os.environ.get("FORGED_NAME"):  # the kernel also names B's client in every request
        endpoint = Endpoint(endpoint.url, endpoint.auth, os.environ["FORGED_NAME"],
                            kernel_credential=endpoint.kernel_credential)
    client = RelayClient(endpoint)
    out = {"origin": registered, "credential": endpoint.kernel_credential}
    out["grant"] = (await client.call("grants.get", {})).get("grant")
    out["budget"] = await client.call("budget.get", {})
    try:
        run_id = (await client.call("run.start", {"conversation": "c", "prompt": "hello"}))["run_id"]
    except RpcError as exc:
        out["run"] = exc.code
    else:
        for _ in range(600):  # the run is in the daemon: ask until it ended
            row = (await client.call("runs.get", {"run_id": run_id}))["run"]
            if row.get("finished_at"):
                break
            await asyncio.sleep(0.05)
        out["run"] = row
    print(json.dumps(out))

asyncio.run(main())
"""


def _kernel(root: Path, url: str, *, notebook: str | None, claim: str | None = None,
            forged_name: str | None = None) -> dict:
    env = env_for(root)
    for key in [k for k in env if k.startswith(("RELAY_", "JPY_"))]:
        del env[key]
    env["RELAY_URL"] = url
    if url.startswith("http"):
        env["RELAY_TOKEN"] = (root / "data" / "relay" / "daemon_token").read_text().strip()
    if notebook:
        env["RELAY_NOTEBOOK"] = notebook  # what a runner gives its kernel at start
    if claim:
        env["CLAIM"] = claim
    if forged_name:
        env["FORGED_NAME"] = forged_name
    done = subprocess.run([sys.executable, "-c", KERNEL], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _audit(root: Path) -> list[dict]:
    path = root / "data" / "relay" / "audit-daemon.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_kernel_of_notebook_a_naming_b_gets_neither_bs_grant_nor_bs_budget(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/s/relay.sock")
    a, b = "/work/a.ipynb", "/work/b.ipynb"
    origin_a, origin_b = "daemon:" + client_name_for(a), "daemon:" + client_name_for(b)
    try:
        assert run_cli(tmp_path, "grants", "add", origin_b, "--tools", "*", "--models", "*",
                       "--budget", "tokens=1000000").returncode == 0
        # the real notebook B: its kernel registers and runs on B's grant
        real_b = _kernel(tmp_path, daemon.address, notebook=b)
        assert real_b["origin"] == origin_b and real_b["grant"]["origin"] == origin_b
        assert real_b["run"]["origin"] == origin_b and real_b["run"]["state"] == "done", real_b["run"]

        # notebook A's kernel claims B when it registers and names B's client in every request: it is A
        evil = _kernel(tmp_path, daemon.address, notebook=a, claim=b, forged_name=client_name_for(b))
        assert evil["origin"] == origin_a
        assert evil["grant"] is None, evil
        assert evil["run"]["origin"] == origin_a and evil["run"]["state"] == "error", evil["run"]
        assert json.dumps(evil["budget"]).count(origin_b) == 0

        # its credential edited to carry B's origin (the MAC no longer matches): the fixed 401
        version, _, mac = evil["credential"].split(".")
        forged = f"{version}.{base64.urlsafe_b64encode(origin_b.encode()).rstrip(b'=').decode()}.{mac}"
        status, _, _, _ = one_shot(daemon, "POST", "/relay/rpc", {"X-Relay-Kernel": forged},
                                   json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.get"}).encode())
        assert status == 401
        # naming B's kernel without any credential: refused (the kernel: names belong to registered kernels)
        status, _, body, _ = one_shot(daemon, "POST", "/relay/rpc", {"X-Relay-Client": client_name_for(b)},
                                      json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.get"}).encode())
        assert status == 403 and b"registered kernel" in body

        # A's own tiny budget refuses A on A's spend: B's tokens are not A's, A's refusal is not B's
        assert run_cli(tmp_path, "grants", "add", origin_a, "--tools", "*", "--models", "*",
                       "--budget", "tokens=5").returncode == 0
        # the daemon read A's grant (none) a moment ago and trusts that read for up to 1 s (its grant cache,
        # docs/daemon.md "within a second"); the terminal CLI is faster than that now: ask again until it shows
        deadline = time.monotonic() + 15
        again = _kernel(tmp_path, daemon.address, notebook=a, claim=b)
        while again["grant"] is None and time.monotonic() < deadline:
            time.sleep(0.5)
            again = _kernel(tmp_path, daemon.address, notebook=a, claim=b)
        assert again["origin"] == origin_a and again["grant"]["origin"] == origin_a
        assert again["budget"].get("usage", {}).get("tokens", 0) == 0, again["budget"]
        assert again["run"]["origin"] == origin_a and again["run"]["state"] == "budget_exhausted", again["run"]
        # stopping: the terminal client (jupyter relay kill) may stop any origin's runs; another named client may not
        def kill(client: str, params: dict) -> dict:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "kill", "params": params}).encode()
            return json.loads(one_shot(daemon, "POST", "/relay/rpc", {"X-Relay-Client": client}, body)[2])
        assert kill("terminal", {"origin": origin_b})["result"] == {"cancelled_runs": 0, "denied_requests": 0}
        assert kill("terminal", {"all": True})["result"]["cancelled_runs"] == 0
        assert kill("other", {"origin": origin_b})["error"]["data"]["code"] == "UNAUTHORIZED"
        assert kill("other", {"all": True})["error"]["data"]["code"] == "UNAUTHORIZED"
        # a kernel that cannot be placed gets a fresh origin of its own each time, never B's
        anon = [_kernel(tmp_path, daemon.address, notebook=None, claim=b)["origin"] for _ in range(2)]
        assert all(o.startswith("daemon:kernel:anon-") for o in anon) and anon[0] != anon[1]
    finally:
        daemon.stop()
    rows = _audit(tmp_path)
    rows_a = [r for r in rows if r["origin"] == origin_a]
    rows_b = [r for r in rows if r["origin"] == origin_b]
    # B's grant paid for B's one run only; A's refusals are A's rows, on A's own spend
    assert sum(1 for r in rows_b if r["tool"].startswith("model:") and r["decision"] == "allow") == 1, rows_b
    assert not any(r.get("code") for r in rows_b), rows_b
    assert not any(r["decision"] == "allow" and r["tool"].startswith("model:") for r in rows_a), rows_a
    assert any(r.get("code") == "BUDGET_EXCEEDED" for r in rows_a), rows_a
    log = (tmp_path / "data" / "relay" / "logs" / "daemon.log").read_text()
    assert f"kernel registered as {origin_a} (notebook from the kernel's environment)" in log
    assert "rk1." not in log  # no credential in the log


def test_over_loopback_tcp_the_daemon_reads_the_kernel_process_too(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0")
    url = f"http://127.0.0.1:{daemon.port}/relay/"
    token = daemon.token()
    try:
        # the peer process is found through /proc/net/tcp: its start-up environment names it, not its claim
        seen = _kernel(tmp_path, url, notebook="/work/a.ipynb", claim="/work/sub/c.ipynb")
        assert seen["origin"] == "daemon:" + client_name_for("/work/a.ipynb") and seen["run"]["state"] == "error"
        anon = _kernel(tmp_path, url, notebook=None, claim="/work/sub/c.ipynb")
        assert anon["origin"].startswith("daemon:kernel:anon-"), anon
        rpc = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.get"}).encode()
        # the credential alone is not enough on TCP: the bearer token comes first
        status, _, _, _ = one_shot(daemon, "POST", "/relay/rpc", {"X-Relay-Kernel": seen["credential"]}, rpc)
        assert status == 401
        status, _, body, _ = one_shot(daemon, "POST", "/relay/rpc", {"Authorization": f"Bearer {token}",
                                                                      "X-Relay-Kernel": seen["credential"],
                                                                      "X-Relay-Client": "kernel:other"}, rpc)
        assert status == 200 and json.loads(body)["result"]["grant"] is None
        status, _, _, _ = one_shot(daemon, "POST", "/relay/rpc", {"Authorization": f"Bearer {token}",
                                                                   "X-Relay-Client": "kernel:work_a.ipynb"}, rpc)
        assert status == 403
        # registering needs the token too
        assert one_shot(daemon, "POST", "/relay/kernel")[0] == 401
    finally:
        daemon.stop()
    key = tmp_path / "data" / "relay" / "daemon_kernel_key"
    assert key.exists() and (os.stat(key).st_mode & 0o077) == 0
