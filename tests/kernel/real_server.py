"""A real Jupyter server with the relay extension (subprocess on 127.0.0.1) and kernels it starts.

Used by the end-to-end tests: the kernel gets RELAY_URL and its credential from the server, exactly as
in JupyterLab, and talks to the real broker.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Self

from jupyter_client.blocking import BlockingKernelClient

TOKEN = "relay-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RealServer:
    """``with RealServer(tmp, relay_config={...}) as srv: kc = srv.kernel_for("t.ipynb")``."""

    def __init__(self, tmp: Path, relay_config: dict[str, Any] | None = None, *, lab: bool = False) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.relay_config = {"in_memory": True, **(relay_config or {})}
        self.lab = lab
        self.clients: list[BlockingKernelClient] = []

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JUPYTER_", "CI"))}
        env.update(JUPYTER_CONFIG_DIR=str(self.tmp / "cfg"), JUPYTER_DATA_DIR=str(self.tmp / "data"),
                   JUPYTER_RUNTIME_DIR=str(self.tmp / "rt"), IPYTHONDIR=str(self.tmp / "ipython"))
        return env

    def __enter__(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = self.tmp / "cfg"
        (cfg / "labconfig").mkdir(parents=True, exist_ok=True)
        (cfg / "jupyter_server_config.json").write_text(json.dumps({
            "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}}, "RelayApp": self.relay_config}))
        (cfg / "labconfig" / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
        app = "jupyterlab.labapp" if self.lab else "jupyter_server"
        self.log = open(self.tmp / "server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", app, "--no-browser", "--allow-root", "--ip", "127.0.0.1", "--port",
             str(self.port), f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={self.root}"],
            env=self.env(), stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.api("GET", "api/status")
                return self
            except OSError:
                time.sleep(0.2)  # waiting for another process to bind its port
        self.__exit__()
        raise RuntimeError("jupyter server did not start: " + (self.tmp / "server.log").read_text()[-2000:])

    def __exit__(self, *exc: object) -> None:
        for kc in self.clients:
            kc.stop_channels()
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()

    def restart(self) -> None:
        """Stop the server process (its kernels go with it) and start a new one on the same port, root, config and
        data dirs: only what is on disk survives (a notebook reopened "on another day")."""
        self.__exit__()
        self.clients.clear()
        self.__enter__()

    def api(self, verb: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=verb,
                                     headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def kernel_rpc(self, credential: str, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One JSON-RPC call to the broker as a kernel (``RelayKernel <credential>``): the whole response
        (``result`` or ``error``). The tests of tests/kernel and tests/server that call the broker with a kernel's
        credential share it."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode()
        req = urllib.request.Request(self.url + "relay/rpc", data=body, method="POST",
                                     headers={"Authorization": f"RelayKernel {credential}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def kernel_for(self, notebook: str) -> BlockingKernelClient:
        """Start a session for ``notebook`` and return a client of its kernel (started by the server)."""
        session = self.api("POST", "api/sessions", {"path": notebook, "type": "notebook", "name": notebook,
                                                   "kernel": {"name": "python3"}})
        kernel_id = session["kernel"]["id"]
        conn = self.tmp / "rt" / f"kernel-{kernel_id}.json"
        deadline = time.monotonic() + 60
        while True:
            if conn.exists():
                kc = BlockingKernelClient(connection_file=str(conn))
                kc.load_connection_file()
                kc.start_channels()
                try:
                    kc.wait_for_ready(timeout=30)
                    break
                except RuntimeError:  # the heartbeat was not up yet: connect again
                    kc.stop_channels()
            if time.monotonic() > deadline:
                raise RuntimeError(f"kernel {kernel_id} never became ready")
            time.sleep(0.2)  # waiting for another process to write its connection file
        self.clients.append(kc)
        return kc
