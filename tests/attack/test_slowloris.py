"""Attack: Slowloris against the daemon's TCP listener.

Another local user who can reach ``jupyter relay serve --listen tcp://...`` but holds no token opens hundreds
of connections and keeps each alive with a byte now and then: request lines and headers sent byte by byte, and
requests whose headers are complete (no token, so the 401 waits for the declared body) whose body trickles.
Nothing is ever buffered for them, but each holds a file descriptor for as long as the attacker likes (tornado
waits an hour for headers, forever for a body), so with the usual soft limit of 1024 descriptors, or here 256,
the daemon stops accepting: before this fix an authenticated client's call never got an answer (and tornado's
accept handler spun on ``EMFILE``). Now connections that have not authenticated are capped
(``server/conn_guard.py``: the oldest unauthenticated one is closed when a new one arrives at the cap); a
connection that has shown the token is never counted. The daemon keeps answering its own client — every call
completes —, its peak memory stays small, and it still answers afterwards.
"""

from __future__ import annotations

import itertools
import json
import resource
import socket
import threading
import time
from pathlib import Path

import pytest
from daemon_harness import Daemon

pytestmark = pytest.mark.slow

FD_LIMIT = 256
ATTACKERS = 600  # well over the daemon's descriptors
SLACK_KB = 24 * 1024
_PEERS = (f"127.0.{n // 250 + 1}.{n % 250 + 1}" for n in itertools.count())

HEADERS_SLOWLY = b"POST /relay/rpc HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
BODY_SLOWLY = (b"POST /relay/anthropic/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: wrong\r\n"
               b"Content-Type: application/json\r\nContent-Length: 900000\r\n\r\n")
KINDS = ((HEADERS_SLOWLY, 1), (BODY_SLOWLY, len(BODY_SLOWLY)))  # (request, bytes sent at once first)


class Loris:
    """One thread holding ``ATTACKERS`` connections open, a byte each per sweep, reconnecting what the
    daemon closes (a real attacker would), never completing a request."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.stop = threading.Event()
        self.socks: list[tuple[socket.socket | None, bytes, int]] = [(None, b"", 0)] * ATTACKERS
        self.opened = self.closed_by_daemon = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, i: int) -> None:
        request, first = KINDS[i % 2]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((next(_PEERS), 0))
        sock.settimeout(2)
        try:
            sock.connect(("127.0.0.1", self.daemon.port))
            sock.sendall(request[:first])
        except OSError:
            sock.close()
            self.socks[i] = (None, request, first)
            return
        sock.setblocking(False)
        self.socks[i] = (sock, request, first)
        self.opened += 1

    def _run(self) -> None:
        for i in range(ATTACKERS):
            if self.stop.is_set():
                return
            self._open(i)
        while not self.stop.is_set():
            reopened = 0
            for i, (sock, request, sent) in enumerate(self.socks):
                if self.stop.is_set():
                    return
                if sock is None:
                    if reopened < 20:  # at most ~200 new connections a second
                        reopened += 1
                        self._open(i)
                    continue
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:
                    sock.close()
                    self.closed_by_daemon += 1
                    self.socks[i] = (None, request, 0)
                    continue
                byte = request[sent:sent + 1] or b"x"  # headers byte by byte, then the body byte by byte
                try:
                    sock.send(byte)
                    self.socks[i] = (sock, request, sent + 1)
                except BlockingIOError:
                    pass
                except OSError:
                    sock.close()
                    self.closed_by_daemon += 1
                    self.socks[i] = (None, request, 0)
            time.sleep(0.1)

    def __enter__(self) -> Loris:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(20)
        for sock, _r, _s in self.socks:
            if sock is not None:
                sock.close()


def _hwm_kb(daemon: Daemon) -> int:
    with open(f"/proc/{daemon.proc.pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def _open_fds(daemon: Daemon) -> int:
    return len(list(Path(f"/proc/{daemon.proc.pid}/fd").iterdir()))


def _rpc(daemon: Daemon, method: str) -> dict:
    """One authenticated call on a fresh connection (a kernel's next request); the harness's 10 s socket
    timeout bounds a call the daemon never answers, which fails the test."""
    return daemon.rpc(method, {})


def _models(daemon: Daemon) -> tuple[int, bytes]:
    conn = daemon.connect()
    try:
        status, _h, body, _raw = conn.request("GET", "/relay/anthropic/v1/models", {"x-api-key": daemon.token()})
        return status, body
    finally:
        conn.close()


def test_slow_unauthenticated_connections_never_starve_an_authenticated_client(plain_tcp_daemon: Daemon) -> None:
    daemon = plain_tcp_daemon
    soft, hard = resource.prlimit(daemon.proc.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(daemon.proc.pid, resource.RLIMIT_NOFILE, (FD_LIMIT, hard))
    try:
        _attack(daemon)
    finally:
        resource.prlimit(daemon.proc.pid, resource.RLIMIT_NOFILE, (soft, hard))


def _attack(daemon: Daemon) -> None:
    assert "result" in _rpc(daemon, "grants.list")  # warm up
    base = _hwm_kb(daemon)
    with Loris(daemon) as loris:
        deadline = time.monotonic() + 30
        while loris.opened < FD_LIMIT + 64 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert loris.opened >= FD_LIMIT + 64, loris.opened  # the attack is in place (over the fd limit)
        time.sleep(1.0)  # a few sweeps of trickled bytes
        for n in range(5):
            assert "result" in _rpc(daemon, "grants.list"), n
            status, body = _models(daemon)  # the broker's own answer (no grant yet), not a timeout
            assert status == 403 and json.loads(body)["relay_code"] == "UNAUTHORIZED", (status, body[:200])
        # a kept-alive authenticated connection keeps working while the attack goes on
        conn = daemon.connect()
        try:
            headers = {"Authorization": f"Bearer {daemon.token()}", "X-Relay-Client": "agent"}
            for n in range(3):
                assert "result" in conn.rpc("grants.list", {}, headers, id=n + 1)
                time.sleep(0.5)
        finally:
            conn.close()
        assert loris.closed_by_daemon > 0  # it was the cap that made room, not the attacker giving up
        assert _open_fds(daemon) < FD_LIMIT
    # HWM is the process's peak so far: another attack on this shared daemon may have raised it before
    assert _hwm_kb(daemon) - base < SLACK_KB, f"peak memory +{_hwm_kb(daemon) - base} kB"
    assert "result" in _rpc(daemon, "grants.list")
    assert daemon.proc.poll() is None
