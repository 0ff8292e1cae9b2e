"""Attack: make the daemon buffer request bodies before it knows who is asking.

Another local user who can reach ``jupyter relay serve --listen tcp://...`` but holds no token sends a 90 MB
body to each endpoint that takes one. Tornado reads a plain handler's whole body (up to its 100 MB
``max_body_size``) before ``prepare`` runs, so before this fix each such request cost the daemon ~180 MB of
peak memory before its 401 (measured: VmHWM 82 MB -> 266 MB on ``/relay/anthropic/v1/messages``,
``/relay/openai/v1/chat/completions`` and ``/relay/mcp``), and a handful of connections at once would exhaust
the machine. Now an unauthenticated body is never buffered (``server/plain._EarlyBody``) and an authenticated
one is capped while it arrives. A small unauthenticated body still gets the usual identical 401 on a
connection that stays usable, and the daemon still serves its own clients afterwards.
"""

from __future__ import annotations

import itertools
import json
import socket
from pathlib import Path

import pytest
from daemon_harness import Daemon, run_cli

pytestmark = pytest.mark.slow

BODY = 90 * 1024 * 1024
SLACK_KB = 16 * 1024  # far below one buffered body (90 MB, ~180 MB peak)
ENDPOINTS = ("/relay/anthropic/v1/messages", "/relay/anthropic/v1/messages/count_tokens",
             "/relay/openai/v1/chat/completions", "/relay/mcp", "/relay/rpc")


_PEERS = (f"127.0.{n // 250 + 1}.{n % 250 + 1}" for n in itertools.count())


def _connect(daemon: Daemon) -> socket.socket:
    """A fresh loopback source address per connection: the token cooldown (3 failures per address) is not
    what is under test here."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((next(_PEERS), 0))
    sock.connect(("127.0.0.1", daemon.port))
    return sock


def _hwm_kb(daemon: Daemon) -> int:
    with open(f"/proc/{daemon.proc.pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def _send_big(daemon: Daemon, path: str, headers: dict[str, str], *, chunked: bool = False) -> bytes:
    """Stream up to ``BODY`` bytes to ``path``; returns what the daemon answered (b"" if it just closed)."""
    sock = _connect(daemon)
    try:
        head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {BODY}")
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        piece = b"x" * (1 << 20)
        frame = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
        try:
            for _ in range(BODY // len(piece)):
                sock.sendall(frame)
        except OSError:
            pass  # refused and closed before the body was read: what we want
        try:
            return sock.recv(4096)
        except OSError:
            return b""
    finally:
        sock.close()


def _raw(daemon: Daemon, conn: socket.socket, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
            f"Content-Length: {len(body)}"] + [f"{k}: {v}" for k, v in headers.items()]
    conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head_raw, rest = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head_raw.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += conn.recv(65536)
    return int(head_raw.split()[1]), rest[:length]


def test_an_unauthenticated_body_is_never_buffered(plain_tcp_daemon: Daemon) -> None:
    daemon = plain_tcp_daemon
    minted = run_cli(daemon.root, "mcp-token", "--client", "agent")
    assert minted.returncode == 0, minted.stderr
    gateway_token = next(w for line in minted.stdout.splitlines() for w in line.split() if w.startswith("relay-mcp-"))
    token = daemon.token()
    # warm up every handler once (imports, first allocations) before the baseline
    for path in ENDPOINTS:
        with _connect(daemon) as conn:
            assert _raw(daemon, conn, path, b"{}", {})[0] == 401
    base = _hwm_kb(daemon)

    for path in ENDPOINTS:
        for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"x-api-key": "wrong"}):
            for chunked in (False, True):
                answer = _send_big(daemon, path, headers, chunked=chunked)
                assert not answer.startswith(b"HTTP/1.1 2"), (path, answer[:80])
                grown = _hwm_kb(daemon) - base
                assert grown < SLACK_KB, f"{path} {headers} chunked={chunked}: peak memory +{grown} kB"

    # authenticated but over the endpoint's cap: refused while it arrives, never buffered whole
    for path, headers in (("/relay/mcp", {"Authorization": f"Bearer {gateway_token}"}),
                          ("/relay/anthropic/v1/messages", {"x-api-key": token}),
                          ("/relay/openai/v1/chat/completions", {"Authorization": f"Bearer {token}"})):
        for chunked in (False, True):
            answer = _send_big(daemon, path, headers, chunked=chunked)
            assert answer == b"" or b" 413 " in answer.split(b"\r\n", 1)[0], (path, answer[:120])
    assert _hwm_kb(daemon) - base < 40 * 1024  # at most one capped (32 MB) model body, never 90 MB

    # a small unauthenticated body: the one identical 401 each time, and the connection stays usable
    for path in ENDPOINTS:
        with _connect(daemon) as conn:
            first = _raw(daemon, conn, path, b'{"x": 1}', {"Authorization": "Bearer nope"})
            second = _raw(daemon, conn, path, b'{"x": 1}', {})
            assert first[0] == second[0] == 401 and first[1] == second[1], (path, first, second)

    # and the daemon still serves its own clients: the gateway, the RPC, with bodies
    with _connect(daemon) as conn:
        status, body = _raw(daemon, conn, "/relay/mcp", json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}).encode(),
            {"Authorization": f"Bearer {gateway_token}", "Accept": "application/json, text/event-stream"})
        assert status == 200 and json.loads(body)["result"]["serverInfo"], body
        status, body = _raw(daemon, conn, "/relay/rpc", json.dumps(
            {"jsonrpc": "2.0", "id": 2, "method": "grants.list", "params": {}}).encode(),
            {"Authorization": f"Bearer {token}", "X-Relay-Client": "agent"})
        assert status == 200 and "result" in json.loads(body), body
