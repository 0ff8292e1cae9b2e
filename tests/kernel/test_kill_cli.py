"""``jupyter relay kill`` (issue 13 item 2): from a terminal, it stops the run of a notebook open in a relay Jupyter
server while that run waits on a push card, and denies the card; the cell fails in one line; nothing is written.
A real Jupyter server (demo backend, a store on disk for the workspace), a real kernel, the real CLI process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import execute, text_of
from .real_server import TOKEN, RealServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    with RealServer(tmp_path_factory.mktemp("srv"), {"in_memory": False}) as srv:
        yield srv


def _rpc(server: RealServer, method: str, params: dict[str, Any]) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    req = urllib.request.Request(server.url + "relay/rpc", data=body, method="POST",
                                 headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["result"]


def _cli(server: RealServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "kill", *args], env=server.env(),
                          capture_output=True, text=True, timeout=60)


def test_jupyter_relay_kill_stops_a_waiting_run_in_the_server(server: RealServer) -> None:
    kc = server.kernel_for("killme.ipynb")
    reply, msgs = execute(kc, "%load_ext relay_jupyter\n%config AgentMagics.consent_ui = 'widget'\n"
                              "relay.connect(['scratch_write', 'scratch_edit', 'scratch_push'])")
    assert reply["status"] == "ok", text_of(msgs)
    done: dict[str, Any] = {}

    def run() -> None:
        done["reply"], done["msgs"] = execute(kc, "%%agent\nwrite a cleaning script to a file", timeout=120)

    cell = threading.Thread(target=run)
    cell.start()
    try:
        deadline = time.monotonic() + 60
        while True:  # the push card is pending at the broker (the cell waits for a click nobody makes)
            pending = _rpc(server, "permission.pending", {})["requests"]
            if any(r.get("tool") == "scratch_push" for r in pending):
                break
            assert time.monotonic() < deadline, "the push card never became pending"
            time.sleep(0.2)  # the demo run is in another process: poll the broker
        out = _cli(server)
    finally:
        cell.join(120)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert f"jupyter server {server.url}: stopped 1 run(s), denied 1 permission request(s)" in out.stdout, out.stdout
    assert done["reply"]["status"] == "error", text_of(done["msgs"])
    assert len([m for m in done["msgs"] if m["msg_type"] == "error"]) == 1
    assert "Traceback" not in text_of(done["msgs"])
    assert not (server.root / "clean.py").exists()
    assert _rpc(server, "permission.pending", {})["requests"] == []
    # nothing left to stop: a second kill says so, and --json is machine-readable
    again = _cli(server, "--json")
    (broker,) = [b for b in json.loads(again.stdout)["brokers"] if b["broker"].startswith("jupyter server")]
    assert broker["cancelled_runs"] == 0 and broker["denied_requests"] == 0 and broker["error"] is None


def test_jupyter_relay_kill_with_no_broker_says_so(tmp_path: Any) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    import os

    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    out = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "kill"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "no relay broker is running" in out.stdout and not out.stderr, out


def test_jupyter_relay_kill_stops_a_waiting_run_in_a_daemon(tmp_path: Any) -> None:
    """A standalone daemon: the CLI is the daemon's terminal client, which may stop every run of its daemon
    (a kernel's origin is bound to its own daemon credential, so the CLI cannot and need not act as it); the run
    waiting on its card ends."""
    import os

    from relay_jupyter.protocol.local import UnixHTTPConnection
    from relay_jupyter.testing.demo_broker import NotebookBroker

    from .conftest import start_kernel

    broker = NotebookBroker().start()
    km = kc = None
    try:
        km, kc = start_kernel({"RELAY_URL": broker.url, "RELAY_NOTEBOOK": "killd.ipynb"}, str(tmp_path))
        reply, msgs = execute(kc, "%load_ext relay_jupyter\n%config AgentMagics.consent_ui = 'widget'\n"
                                  "relay.connect(['scratch_write', 'scratch_edit', 'scratch_push'])")
        assert reply["status"] == "ok", text_of(msgs)
        done: dict[str, Any] = {}

        def run() -> None:
            done["reply"], done["msgs"] = execute(kc, "%%agent\nwrite a cleaning script to a file", timeout=120)

        # the notebook's pending requests, seen as that notebook: a process started with the environment a runner
        # gives the kernel registers as the same origin (the daemon reads the process, docs/daemon.md)
        code = ("import asyncio; from relay_jupyter.kernel.discovery import discover; "
                "print(asyncio.run(discover(client_name='kernel:x', start_daemon=False)).kernel_credential)")
        as_notebook = {**os.environ, "RELAY_URL": broker.url, "RELAY_NOTEBOOK": "killd.ipynb"}
        credential = subprocess.run([sys.executable, "-c", code], env=as_notebook, capture_output=True, text=True,
                                    timeout=60, check=True).stdout.strip()

        def pending() -> list[dict[str, Any]]:
            conn = UnixHTTPConnection(str(broker.socket_path), 60)  # a loaded machine: the daemon may lag
            try:
                conn.request("POST", "/relay/rpc", json.dumps({"jsonrpc": "2.0", "id": 1,
                                                                "method": "permission.pending", "params": {}}),
                             {"Content-Type": "application/json", "X-Relay-Kernel": credential})
                return json.loads(conn.getresponse().read())["result"]["requests"]
            finally:
                conn.close()

        cell = threading.Thread(target=run)
        cell.start()
        try:
            deadline = time.monotonic() + 60
            while not any(r.get("tool") == "scratch_push" for r in pending()):
                assert time.monotonic() < deadline, "the push card never became pending"
                time.sleep(0.2)  # the demo run is in the daemon's process: poll it
            env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JUPYTER_"))}
            env["JUPYTER_RUNTIME_DIR"] = str(broker._path("runtime"))  # where this daemon wrote its state file
            out = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "kill"], env=env, capture_output=True,
                                 text=True, timeout=60)
        finally:
            cell.join(120)
        assert out.returncode == 0, (out.stdout, out.stderr)
        assert f"daemon {broker.url}" in out.stdout and "stopped 1 run(s), denied 1 permission request(s)" in \
            out.stdout, out.stdout
        assert done["reply"]["status"] == "error" and "Traceback" not in text_of(done["msgs"]), text_of(done["msgs"])
        assert pending() == [] and not (broker.project / "clean.py").exists()
    finally:
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            km.shutdown_kernel(now=True)
        broker.stop()


def test_jupyter_relay_status_sees_the_broker_of_a_jupyter_server(server: RealServer) -> None:
    """Issue 13 item 7: `jupyter relay status` said "no relay daemon is running" while JupyterLab's broker ran."""
    out = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "status"], env=server.env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert f"jupyter server {server.url}  pid {server.proc.pid}  ready  active runs 0" in out.stdout, out.stdout
    assert "no relay daemon is running" not in out.stdout and TOKEN not in out.stdout + out.stderr
    listed = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "status", "--json"], env=server.env(),
                            capture_output=True, text=True, timeout=60)
    (row,) = json.loads(listed.stdout)["jupyter_servers"]
    assert row["url"] == server.url and row["ready"] is True and row["error"] is None


def test_jupyter_relay_logs_and_grants_see_the_broker_of_a_jupyter_server(server: RealServer) -> None:
    """Issue 13 item 7: `logs` and `grants` found only daemons. Now `logs` tails the server's relay log
    (server/server_state.py) and `grants` reads and writes the store the server's broker reads."""
    env = server.env()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "relay_jupyter.cli", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    granted = cli("grants", "add", "notebook:from_cli.ipynb", "--tools", "list_variables", "--models", "*")
    assert granted.returncode == 0, granted.stderr
    seen = _rpc(server, "grants.get", {"origin": "notebook:from_cli.ipynb"})  # the server's broker sees it
    assert seen["grant"] is not None and seen["grant"]["tools"] == ["list_variables"], seen
    listed = json.loads(cli("grants", "list", "--json").stdout)
    assert "notebook:from_cli.ipynb" in [g["origin"] for g in listed["grants"]]
    revoked = cli("grants", "revoke", "notebook:from_cli.ipynb")
    assert revoked.returncode == 0 and "revoked the grant" in revoked.stdout, revoked
    deadline = time.monotonic() + 30
    while _rpc(server, "grants.get", {"origin": "notebook:from_cli.ipynb"})["grant"] is not None:
        assert time.monotonic() < deadline, "the server's broker still sees the revoked grant"
        time.sleep(0.2)  # its grant cache lives a second

    logs = cli("logs", "-n", "400")
    assert logs.returncode == 0, (logs.stdout, logs.stderr)
    log_file = server.tmp / "data" / "relay" / "logs" / f"jupyter-server-{server.proc.pid}.log"
    assert log_file.exists() and (log_file.parent.stat().st_mode & 0o077) == 0
    # relay's own lines, as the server logged them
    assert f"relay_jupyter.server: relay broker of the Jupyter server at {server.url} (pid {server.proc.pid})" \
        in logs.stdout, logs.stdout
    assert logs.stdout.strip().splitlines()[-1] in log_file.read_text()
    assert TOKEN not in logs.stdout + logs.stderr
