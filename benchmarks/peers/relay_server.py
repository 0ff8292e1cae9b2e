"""A Jupyter server with the relay extension (the broker) pointed at the fake, for the ``%%agent`` variant.

The server runs from our venv on 127.0.0.1 with its own config/data/runtime directories. Kernels are
started through its REST API (``POST /api/sessions``), so each gets its relay credential, exactly as a
notebook opened in JupyterLab would; the benchmark then attaches to the kernel through the connection
file the server wrote. The grant a person would give by clicking Connect is created over the relay
RPC as a browser session of the server's user (``grants.create`` naming the notebook's origin).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

__all__ = ["RelayServer"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RelayServer:
    """``jupyter server`` + relay extension in a subprocess; stop with :meth:`stop`."""

    def __init__(self, base: Path, *, anthropic_base_url: str, api_key: str, model: str) -> None:
        self.base = base
        self.token = secrets.token_hex(24)
        self.port = _free_port()
        self.model = model
        self.url = f"http://127.0.0.1:{self.port}"
        self.root = base / "root"
        self.runtime = base / "runtime"
        self.log_path = base / "server.log"
        for d in (self.root, self.runtime, base / "config", base / "data", base / "ipython"):
            d.mkdir(parents=True, exist_ok=True)
        config = {
            "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}, "ip": "127.0.0.1", "port": self.port,
                          "port_retries": 0, "open_browser": False, "root_dir": str(self.root)},
            "IdentityProvider": {"token": self.token},
            "RelayApp": {"anthropic_base_url": anthropic_base_url, "anthropic_api_key": api_key,
                         "default_model": model, "default_backend": "anthropic", "in_memory": True},
        }
        (base / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
        self.env = {**os.environ, "JUPYTER_CONFIG_DIR": str(base / "config"), "JUPYTER_DATA_DIR": str(base / "data"),
                    "JUPYTER_RUNTIME_DIR": str(self.runtime), "IPYTHONDIR": str(base / "ipython")}
        # the broker's key reaches it through the config only; nothing in the kernels' environment
        for name in ("ANTHROPIC_API_KEY", "RELAY_URL", "RELAY_KERNEL_CREDENTIAL", "RELAY_TOKEN"):
            self.env.pop(name, None)
        self.process: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"token {self.token}"}, timeout=30)

    def start(self, timeout: float = 240.0) -> RelayServer:
        """Start the server and wait until its API answers (at a load of 10 on this 2-core machine it took
        over 60 s: the relay extension and JupyterLab import under contention)."""
        jupyter = Path(sys.executable).with_name("jupyter")
        args = [str(jupyter), "server", "--no-browser"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--allow-root")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, env=self.env, cwd=self.root, stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter server exited: {self.log_tail()}")
            try:
                if self.http.get("/api/status").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)  # polling a subprocess's port: there is no event to wait on
        raise RuntimeError(f"jupyter server did not answer in {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def rpc(self, method: str, params: dict[str, Any]) -> Any:
        """One JSON-RPC call as a browser session of the server's user; raises on an error."""
        r = self.http.post("/relay/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                           headers={"X-Relay-Client": "benchmark"})
        r.raise_for_status()
        body = r.json()
        if "error" in body:
            raise RuntimeError(f"relay {method}: {body['error']}")
        return body["result"]

    def open_notebook(self, path: str) -> tuple[str, str, Path]:
        """Start a kernel for notebook ``path`` through the sessions API and grant its origin the
        model (no tools). Returns (session id, kernel id, connection file)."""
        r = self.http.post("/api/sessions", json={"path": path, "name": path, "type": "notebook",
                                                  "kernel": {"name": "python3"}})
        r.raise_for_status()
        session = r.json()
        kernel_id = session["kernel"]["id"]
        self.rpc("grants.create", {"origin": f"notebook:{path}", "tools": [], "models": [self.model],
                                   "budget": {"requests_per_minute": None, "tokens_per_day": None,
                                              "cost_per_day_usd": None}})
        connection = self.runtime / f"kernel-{kernel_id}.json"
        deadline = time.monotonic() + 30
        while not connection.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the server writes the file as the kernel starts
        return session["id"], kernel_id, connection

    def close_notebook(self, session_id: str) -> None:
        """Delete the session (shuts its kernel down)."""
        self.http.delete(f"/api/sessions/{session_id}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s)."""
        self.http.close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
