"""Start ``jupyter-relay serve`` as a real subprocess and talk raw HTTP/1.1 to it (TCP or Unix socket).

A uniquely named module (tests/ has no packages). Every daemon started here is stopped by its fixture.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START_TIMEOUT = 60.0


def relay_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "relay_jupyter.cli", *args]


def env_for(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(JUPYTER_DATA_DIR=str(root / "data"), JUPYTER_RUNTIME_DIR=str(root / "rt"),
               JUPYTER_CONFIG_DIR=str(root / "cfg"), PYTHONUNBUFFERED="1")
    for name in ("RELAY_URL", "RELAY_TOKEN", "ANTHROPIC_API_KEY"):
        env.pop(name, None)
    return env


def run_cli(root: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(relay_cmd(*args), env=env_for(root), capture_output=True, text=True, timeout=timeout,
                          check=False)


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    root: Path
    address: str
    stdout: bytes = b""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.root / "data" / "relay"

    @property
    def runtime_dir(self) -> Path:
        return self.root / "rt" / "relay"

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def socket_path(self) -> str:
        return self.address[len("unix://"):]

    def token(self) -> str:
        return (self.data_dir / "daemon_token").read_text().strip()

    def connect(self, source_ip: str | None = None) -> Conn:
        if self.address.startswith("unix://"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.connect(self.socket_path)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(10)
            if source_ip:
                sock.bind((source_ip, 0))  # 127.0.0.0/8 all reach lo: a distinct peer address per test
            sock.connect(("127.0.0.1", self.port))
        return Conn(sock)

    def rpc(self, method: str, params: dict[str, Any], client: str = "agent") -> dict[str, Any]:
        """One JSON-RPC call with the daemon token as client ``client``, on a connection of its own."""
        conn = self.connect()
        try:
            return conn.rpc(method, params, {"Authorization": f"Bearer {self.token()}", "X-Relay-Client": client})
        finally:
            conn.close()

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def start_daemon(root: Path, *args: str) -> Daemon:
    """Start ``serve`` with ``args`` and wait for its "listening on" line."""
    with open(root / "daemon.stderr", "ab") as err:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(relay_cmd("serve", *args), env=env_for(root), stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    out = b""
    while b"\n" not in out:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            proc.wait(5)
            err = (root / "daemon.stderr").read_text(errors="replace")
            raise AssertionError(f"daemon did not start: {out!r} {err[-2000:]}")
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                continue
            out += chunk
    line = out.split(b"\n", 1)[0].decode()
    assert line.startswith("relay daemon listening on "), line
    return Daemon(proc=proc, root=root, address=line.rsplit(" ", 1)[1], stdout=out)


class Conn:
    """One keep-alive HTTP/1.1 connection; responses are returned raw as well as parsed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if method == "POST" and "Content-Length" not in (headers or {}):
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the daemon")
        self.buf += chunk

    def read(self) -> tuple[int, dict[str, str], bytes, bytes]:
        """(status, headers lower-cased, body, raw response bytes)."""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            self._fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, headers, body, head + b"\r\n\r\n" + body

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                body: bytes = b"") -> tuple[int, dict[str, str], bytes, bytes]:
        self.send(method, path, headers, body)
        return self.read()

    def rpc(self, method: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
            id: int = 1) -> dict[str, Any]:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            msg["params"] = params
        status, _, body, _ = self.request("POST", "/relay/rpc", headers, json.dumps(msg).encode())
        assert status == 200, (status, body)
        return json.loads(body)


def one_shot(daemon: Daemon, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"",
             source_ip: str | None = None) -> tuple[int, dict[str, str], bytes, bytes]:
    conn = daemon.connect(source_ip)
    try:
        return conn.request(method, path, headers, body)
    finally:
        conn.close()


def auth_events(daemon: Daemon) -> list[dict[str, Any]]:
    path = daemon.data_dir / "logs" / "auth.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` (state in another process: no event to await)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
