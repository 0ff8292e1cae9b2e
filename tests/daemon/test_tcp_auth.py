"""TCP transport: bearer token on every path, one byte-identical 401, cooldown, URL tokens, rotation."""

from __future__ import annotations

import json
import secrets

import pytest
from daemon_harness import auth_events, one_shot, run_cli, start_daemon, wait_for

from relay_jupyter.server.plain import UNAUTHORIZED_BODY

RPC = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.get"}).encode()
PATHS = [("POST", "/relay/rpc"), ("GET", "/relay/events"), ("GET", "/relay/healthz"), ("GET", "/relay/readyz"),
         ("GET", "/relay/metrics"), ("GET", "/relay/nope"), ("GET", "/")]


def _ip(a: int, b: int) -> str:
    return f"127.0.{a}.{b}"


def _bad_headers(token: str) -> dict[str, dict[str, str]]:
    return {
        "missing": {},
        "empty": {"Authorization": ""},
        "scheme only": {"Authorization": "Bearer"},
        "basic": {"Authorization": f"Basic {token}"},
        "two values": {"Authorization": f"Bearer {token} {token}"},
        "non-ascii": {"Authorization": "Bearer t\u00f6ken".encode().decode("latin-1")},
        "wrong": {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"},
        "case changed": {"Authorization": f"Bearer {token.swapcase()}"},
        "one char short": {"Authorization": f"Bearer {token[:-1]}"},
        "one char long": {"Authorization": f"Bearer {token}A"},
        "prefix only": {"Authorization": f"Bearer {token[:8]}"},
    }


def test_every_refusal_is_one_byte_identical_401(tcp_daemon):
    token = tcp_daemon.token()
    raws = set()
    n = 0
    for i, (name, headers) in enumerate(_bad_headers(token).items()):
        for j, (method, path) in enumerate(PATHS):
            n += 1
            # at most one failure per source address: none of these may trip the cooldown
            status, hdrs, body, raw = one_shot(tcp_daemon, method, path, headers,
                                               RPC if method == "POST" else b"", source_ip=_ip(10 + i, 1 + j))
            assert status == 401, (name, path, status, body)
            assert body == UNAUTHORIZED_BODY
            assert "date" not in hdrs and hdrs["www-authenticate"].startswith("Bearer")
            raws.add(raw)
    assert n > 50 and len(raws) == 1, raws
    assert token.encode() not in next(iter(raws))


def test_good_token_on_every_path_and_connection_usable_after_401(tcp_daemon):
    conn = tcp_daemon.connect(_ip(40, 1))
    try:
        status, _, _, _ = conn.request("GET", "/relay/healthz", {"Authorization": "Bearer nope"})
        assert status == 401
        # a refused POST has its (small) body read and dropped, so the keep-alive connection survives
        status, _, body, _ = conn.request("POST", "/relay/rpc", {"Authorization": "Bearer nope"}, RPC)
        assert status == 401 and body == UNAUTHORIZED_BODY
        good = {"Authorization": f"Bearer {tcp_daemon.token()}"}
        for method, path in (("GET", "/relay/healthz"), ("GET", "/relay/readyz"), ("GET", "/relay/metrics")):
            status, _, _, _ = conn.request(method, path, good)
            assert status == 200, path
        # the scheme is case-insensitive (RFC 7235); the token is not
        assert conn.request("GET", "/relay/healthz", {"Authorization": f"bearer {tcp_daemon.token()}"})[0] == 200
        status, _, body, _ = conn.request("GET", "/relay/nope", good)
        assert status == 404 and b"Traceback" not in body
    finally:
        conn.close()


def test_three_failures_start_a_cooldown_with_retry_after(tcp_daemon):
    ip = _ip(50, 1)
    conn = tcp_daemon.connect(ip)
    try:
        for _ in range(3):
            assert conn.request("GET", "/relay/healthz", {"Authorization": "Bearer wrong"})[0] == 401
        # now even the right token is refused from this peer: guesses cannot be tested during a cooldown
        status, headers, body, _ = conn.request("GET", "/relay/healthz",
                                                {"Authorization": f"Bearer {tcp_daemon.token()}"})
        assert status == 429 and 50 <= int(headers["retry-after"]) <= 60
        assert "date" not in headers and tcp_daemon.token().encode() not in body
    finally:
        conn.close()
    # a fresh connection from the same address is still cooling down; another address is not
    assert one_shot(tcp_daemon, "GET", "/relay/healthz", {"Authorization": f"Bearer {tcp_daemon.token()}"},
                    source_ip=ip)[0] == 429
    assert one_shot(tcp_daemon, "GET", "/relay/healthz", {"Authorization": f"Bearer {tcp_daemon.token()}"},
                    source_ip=_ip(50, 2))[0] == 200
    events = [e for e in auth_events(tcp_daemon) if e["peer"].get("ip") == ip]
    assert [e["outcome"] for e in events].count("refused") == 3
    assert any(e["outcome"] == "cooldown_started" for e in events)
    assert any(e["outcome"] == "cooldown" for e in events)
    assert {e["reason"] for e in events if e["outcome"] == "refused"} == {"wrong"}


def test_token_in_url_is_refused_and_never_logged(tcp_daemon):
    token = tcp_daemon.token()
    good = {"Authorization": f"Bearer {token}"}
    for k, query in enumerate((f"token={token}", f"access_token={token}", f"since=0&TOKEN={token}")):
        status, _, body, _ = one_shot(tcp_daemon, "GET", f"/relay/events?{query}", good, source_ip=_ip(60, 1 + k))
        assert status == 400 and b"Authorization header" in body and token.encode() not in body
    # the token as a path segment: 404 behind auth, and masked in the log
    assert one_shot(tcp_daemon, "GET", f"/relay/{token}", good, source_ip=_ip(60, 9))[0] == 404
    # a query string with an innocent name is not logged either, but is served
    assert one_shot(tcp_daemon, "GET", "/relay/healthz?x=1", good, source_ip=_ip(60, 10))[0] == 200
    logs = tcp_daemon.data_dir / "logs"
    texts = {p.name: p.read_text() for p in logs.iterdir()}
    texts["stderr"] = (tcp_daemon.root / "daemon.stderr").read_text()
    for name, text in texts.items():
        assert token not in text, name
        assert "token=" not in text.lower(), name
    assert "/relay/<redacted>" in texts["daemon.log"]
    reasons = [e.get("reason") for e in auth_events(tcp_daemon)]
    assert reasons.count("token_in_url") >= 3


def test_token_never_in_metrics_events_or_auth_log(tcp_daemon):
    token = tcp_daemon.token()
    good = {"Authorization": f"Bearer {token}"}
    status, _, body, _ = one_shot(tcp_daemon, "GET", "/relay/metrics", good, source_ip=_ip(70, 1))
    assert status == 200 and b"relay_http_requests" in body and token.encode() not in body
    status, _, body, _ = one_shot(tcp_daemon, "POST", "/relay/rpc", good,
                                  json.dumps({"jsonrpc": "2.0", "id": 1, "method": "audit.tail",
                                              "params": {}}).encode(), source_ip=_ip(70, 2))
    assert status == 200 and token.encode() not in body
    raw = (tcp_daemon.data_dir / "logs" / "auth.jsonl").read_text()
    assert raw and token not in raw and "Bearer" not in raw
    for event in auth_events(tcp_daemon):
        assert set(event) <= {"ts", "event", "outcome", "transport", "peer", "reason", "path"}


def test_rpc_over_tcp_and_connection_usable_after_bad_requests(tcp_daemon):
    good = {"Authorization": f"Bearer {tcp_daemon.token()}", "X-Relay-Client": "tcp-test"}
    conn = tcp_daemon.connect(_ip(80, 1))
    try:
        for bad in (b"{not json", b'{"jsonrpc":"2.0","id":1,"id":2,"method":"grants.get"}', b"\xff\xfe",
                    b'{"jsonrpc":"2.0","id":1,"method":"no.such"}', b"[]", b'{"jsonrpc":"2.0","id":1,"x":NaN}'):
            status, _, body, _ = conn.request("POST", "/relay/rpc", good, bad)
            assert status == 200 and json.loads(body)["error"]["code"] in (-32700, -32600, -32601, -32602)
        assert conn.rpc("grants.get", {}, good)["result"] == {"grant": None}
        budget = conn.rpc("budget.get", {}, good)
        assert "result" in budget or budget["error"]["data"]["code"] == "UNAUTHORIZED"
        status, _, body, _ = conn.request("POST", "/relay/rpc", {**good, "X-Relay-Client": "bad name!"}, RPC)
        assert status == 400 and b"X-Relay-Client" in body
        assert conn.rpc("grants.get", {}, good)["result"] == {"grant": None}
    finally:
        conn.close()
    # an oversized body is refused (413) before it is read whole
    conn = tcp_daemon.connect(_ip(80, 2))
    try:
        conn.send("POST", "/relay/rpc", {**good, "Content-Length": str(2 << 20)})
        assert conn.read()[0] == 413
    finally:
        conn.close()


def test_rotate_invalidates_the_old_token_and_closes_its_streams(tcp_daemon):
    old = tcp_daemon.token()
    stream = tcp_daemon.connect(_ip(90, 1))
    stream.send("GET", "/relay/events", {"Authorization": f"Bearer {old}"})
    while b"\r\n\r\n" not in stream.buf:
        stream._fill()
    assert stream.buf.startswith(b"HTTP/1.1 200")
    done = run_cli(tcp_daemon.root, "token", "rotate")
    assert done.returncode == 0 and old not in done.stdout and old not in done.stderr
    new = tcp_daemon.token()
    assert new != old and len(new) == 43
    mode = (tcp_daemon.data_dir / "daemon_token").stat().st_mode & 0o777
    assert mode == 0o600
    assert one_shot(tcp_daemon, "GET", "/relay/healthz", {"Authorization": f"Bearer {old}"},
                    source_ip=_ip(90, 2))[0] == 401
    assert one_shot(tcp_daemon, "GET", "/relay/healthz", {"Authorization": f"Bearer {new}"},
                    source_ip=_ip(90, 3))[0] == 200

    def closed() -> bool:
        try:
            stream._fill()
        except (ConnectionError, OSError):
            return True
        return False

    wait_for(closed, 15, "the old token's event stream to be closed")
    stream.close()


@pytest.mark.slow
def test_unauthenticated_metrics_opt_out(tmp_path):
    daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0", "--unauthenticated-metrics")
    try:
        for path in ("/relay/healthz", "/relay/readyz", "/relay/metrics"):
            assert one_shot(daemon, "GET", path)[0] == 200, path
        # everything else still needs the token
        assert one_shot(daemon, "POST", "/relay/rpc", {}, RPC, source_ip="127.0.1.1")[0] == 401
        assert one_shot(daemon, "GET", "/relay/events", source_ip="127.0.1.2")[0] == 401
        # a credential in the query of an open endpoint is still refused
        assert one_shot(daemon, "GET", "/relay/metrics?token=x", source_ip="127.0.1.3")[0] == 400
    finally:
        assert daemon.stop() == 0
    assert "--unauthenticated-metrics" in (tmp_path / "daemon.stderr").read_text()
