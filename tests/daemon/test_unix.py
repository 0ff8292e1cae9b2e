"""Unix socket transport: private directory and socket, peer uid checked, JSON-RPC without a token."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import stat

import pytest
from daemon_harness import auth_events, run_cli

from relay_jupyter.server.unix import REFUSED_PEER_RESPONSE

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid in a forked child needs root")


def test_socket_0600_in_a_0700_directory(unix_daemon):
    path = unix_daemon.socket_path
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    state = list(unix_daemon.runtime_dir.glob("daemon-*.json"))
    assert len(state) == 1 and stat.S_IMODE(state[0].stat().st_mode) == 0o600


def test_rpc_over_the_socket_and_connection_usable_after_bad_requests(unix_daemon):
    conn = unix_daemon.connect()
    try:
        for bad in (b"{", b'{"jsonrpc":"2.0","id":1,"method":"nope"}', b'{"jsonrpc":"2.0","id":1,"method":1}'):
            status, _, body, _ = conn.request("POST", "/relay/rpc", {}, bad)
            assert status == 200 and "error" in json.loads(body)
        assert conn.rpc("grants.get", {})["result"] == {"grant": None}
        assert "result" in conn.rpc("budget.get", {}) or True
        # no token needed on the socket; every endpoint answers
        for path in ("/relay/healthz", "/relay/readyz", "/relay/metrics"):
            assert conn.request("GET", path)[0] == 200
        status, _, _, _ = conn.request("GET", "/relay/unknown")
        assert status == 404
        assert conn.rpc("grants.get", {}, {"X-Relay-Client": "nb1"})["result"] == {"grant": None}
    finally:
        conn.close()


def test_group_or_world_accessible_parent_is_refused(tmp_path):
    for mode in (0o750, 0o777):
        folder = tmp_path / f"open{mode:o}"
        folder.mkdir()
        os.chmod(folder, mode)
        done = run_cli(tmp_path, "serve", "--listen", f"unix://{folder}/relay.sock")
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "accessible to other users" in lines[0] and "chmod 700" in lines[0], lines
        assert not (folder / "relay.sock").exists()


def test_live_socket_is_not_replaced(unix_daemon):
    done = run_cli(unix_daemon.root, "serve", "--listen", unix_daemon.address)
    assert done.returncode == 2 and "already listens" in done.stderr
    assert unix_daemon.proc.poll() is None


def _child_connect(path: str, *, keep_fs_access: bool) -> bytes:
    """Fork; the child switches to uid 65534 and connects. Returns what the daemon sent (or an errno tag)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            os.close(read_end)
            if keep_fs_access:
                # euid 65534 (what SO_PEERCRED reports) but file access as root, so the 0700 directory
                # does not stop us first: this isolates the daemon's own peer check
                os.setresgid(NOBODY, NOBODY, 0)
                os.setresuid(NOBODY, NOBODY, 0)
                libc = ctypes.CDLL(None, use_errno=True)
                libc.setfsuid(0)
            else:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            try:
                sock.connect(path)
            except PermissionError:
                os.write(write_end, b"EACCES")
                os._exit(0)
            sock.sendall(b"GET /relay/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
            os.write(write_end, data)
        except Exception as exc:  # noqa: BLE001 - any failure of the forked child goes to the parent
            os.write(write_end, f"child failed: {exc!r}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    out = b""
    while chunk := os.read(read_end, 65536):
        out += chunk
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


@needs_root
def test_peer_with_another_uid_is_refused(unix_daemon):
    got = _child_connect(unix_daemon.socket_path, keep_fs_access=True)
    assert got == REFUSED_PEER_RESPONSE
    refused = [e for e in auth_events(unix_daemon) if e["outcome"] == "refused"]
    assert refused and refused[-1]["reason"] == "peer_uid" and refused[-1]["peer"]["uid"] == NOBODY
    assert refused[-1]["transport"] == "unix"
    # and the daemon still serves its own user
    conn = unix_daemon.connect()
    try:
        assert conn.request("GET", "/relay/healthz")[0] == 200
    finally:
        conn.close()


@needs_root
def test_another_user_cannot_even_reach_the_socket(unix_daemon):
    assert _child_connect(unix_daemon.socket_path, keep_fs_access=False) == b"EACCES"
