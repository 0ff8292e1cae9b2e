"""Pure parts of the daemon's auth: token file, bearer check, cooldown tracker, auth log, --listen parsing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from relay_jupyter.core.errors import ConfigRefusal
from relay_jupyter.server.daemon import parse_listen
from relay_jupyter.server.daemon_auth import (
    AuthLog,
    FailureTracker,
    TokenSource,
    check_bearer,
    ensure_token,
    read_token,
    rotate_token,
    url_has_credentials,
)
from relay_jupyter.server.unix import check_socket_dir


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_cooldown_after_three_failures_within_the_window():
    clock = Clock()
    t = FailureTracker(clock=clock)
    assert not t.failure("a") and not t.failure("a")
    clock.now += 11  # the first two fall out of the 10 s window
    assert not t.failure("a") and not t.failure("a")
    assert t.cooldown_left("a") == 0
    assert t.failure("a")  # third within 10 s
    assert t.cooldown_left("a") == pytest.approx(60) and t.retry_after("a") == 60
    assert t.cooldown_left("b") == 0  # per peer
    clock.now += 59.5
    assert t.retry_after("a") == 1
    clock.now += 1
    assert t.cooldown_left("a") == 0


def test_tracker_memory_is_bounded():
    t = FailureTracker(max_peers=100, clock=Clock())
    for i in range(10_000):
        t.failure(f"10.0.{i // 256}.{i % 256}")
    assert len(t._fails) <= 100


def test_check_bearer():
    token = b"A" * 43
    assert check_bearer("Bearer " + "A" * 43, token) == (True, "ok")
    assert check_bearer("bEaReR " + "A" * 43, token) == (True, "ok")
    assert check_bearer(None, token) == (False, "missing")
    assert check_bearer("", token) == (False, "missing")
    assert check_bearer("Basic " + "A" * 43, token) == (False, "malformed")
    assert check_bearer("Bearer", token) == (False, "malformed")
    assert check_bearer("Bearer a b", token) == (False, "malformed")
    assert check_bearer("Bearer t\u00f6k", token) == (False, "malformed")
    assert check_bearer("Bearer " + "a" * 43, token) == (False, "wrong")
    assert check_bearer("Bearer " + "A" * 42, token) == (False, "wrong")
    # no token on disk: nothing is accepted, not even an empty-looking match
    assert check_bearer("Bearer " + "\x00" * 43, None)[0] is False


def test_token_file_is_private_and_rotates(tmp_path):
    path = tmp_path / "daemon_token"
    assert read_token(path) is None
    ensure_token(path)
    first = read_token(path)
    assert first is not None and len(first) == 43 and (path.stat().st_mode & 0o777) == 0o600
    ensure_token(path)
    assert read_token(path) == first  # ensure never replaces
    source = TokenSource(path)
    gen = source.generation
    rotate_token(path)
    assert source.current() != first and source.generation == gen + 1
    os.chmod(path, 0o644)
    with pytest.raises(ConfigRefusal, match="readable by other users"):
        read_token(path)
    os.chmod(path, 0o600)
    path.write_bytes(b"x" * 5000)
    with pytest.raises(ConfigRefusal, match="too large"):
        read_token(path)


def test_token_source_fails_closed_on_an_unsafe_file(tmp_path):
    path = tmp_path / "daemon_token"
    ensure_token(path)
    source = TokenSource(path)
    assert source.current()
    os.chmod(path, 0o640)
    os.utime(path, ns=(1, 1))  # a new signature, so the source re-reads
    assert source.current() is None
    path.unlink()
    assert source.current() is None


def test_symlinked_token_refused(tmp_path):
    real = tmp_path / "real"
    ensure_token(real)
    link = tmp_path / "daemon_token"
    link.symlink_to(real)
    with pytest.raises(ConfigRefusal):
        read_token(link)


def test_url_credentials():
    assert url_has_credentials({"token": [b"x"]}) and url_has_credentials({"Access_Token": [b""]})
    assert not url_has_credentials({"since": [b"1"]})


def test_auth_log_is_private_json_lines_and_rotates(tmp_path):
    log = AuthLog(tmp_path / "logs" / "auth.jsonl", max_bytes=400, keep=2)
    for i in range(20):
        log.event("refused", "tcp", {"ip": f"127.0.0.{i}"}, reason="wrong", path="/relay/rpc")
    log.close()
    files = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert files == ["auth.jsonl", "auth.jsonl.1", "auth.jsonl.2"]
    for name in files:
        path = tmp_path / "logs" / name
        assert (path.stat().st_mode & 0o777) == 0o600
        for line in path.read_text().splitlines():
            assert json.loads(line)["outcome"] == "refused"
    assert (tmp_path / "logs").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("spec", ["unix:///tmp/r.sock", "tcp://127.0.0.1:0", "tcp://[::1]:8765", "tcp://localhost:1"])
def test_parse_listen_good(spec):
    listen = parse_listen(spec)
    assert listen.kind in ("unix", "tcp")
    if listen.kind == "unix":
        assert listen.path == Path("/tmp/r.sock")


@pytest.mark.parametrize("spec", ["unix://rel.sock", "unix:///tmp/x.sock?x=1", "tcp://127.0.0.1", "tcp://:80",
                                  "tcp://u:p@127.0.0.1:1", "tcp://127.0.0.1:1/path", "http://127.0.0.1:1",
                                  "tcp://127.0.0.1:abc", "127.0.0.1:80", "unix:///tmp/\x00x"])
def test_parse_listen_bad(spec):
    with pytest.raises(ConfigRefusal, match="--listen takes"):
        parse_listen(spec)


def test_socket_dir_checks(tmp_path):
    fresh = tmp_path / "new" / "deeper"
    check_socket_dir(fresh / "s.sock")
    assert fresh.stat().st_mode & 0o777 == 0o700
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ConfigRefusal, match="symlink"):
        check_socket_dir(tmp_path / "link" / "s.sock")
    with pytest.raises(ConfigRefusal, match="longer than"):
        check_socket_dir(tmp_path / ("x" * 120) / "s.sock")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigRefusal, match="not a directory"):
        check_socket_dir(tmp_path / "file" / "s.sock")
