"""status / stop / logs, the idle timeout, graceful signals, and the kernel side's auto-start command."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import Daemon, env_for, run_cli, start_daemon, wait_for

from relay_jupyter.cli import main
from relay_jupyter.kernel.discovery import daemon_command


def test_status_logs_and_stop_of_the_kernel_side_auto_started_daemon(tmp_path):
    # exactly the command kernel/discovery.py runs, on the socket path it expects
    sock = tmp_path / "rt" / "relay" / "relay.sock"
    cmd = daemon_command(sock)
    assert cmd[:3] == [sys.executable, "-m", "relay_jupyter.cli"]
    proc = subprocess.Popen(cmd, env=env_for(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    daemon = Daemon(proc=proc, root=tmp_path, address=f"unix://{sock}")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.strip() == f"relay daemon listening on unix://{sock}"
        status = run_cli(tmp_path, "status")
        assert status.returncode == 0, status.stderr
        assert f"unix://{sock}" in status.stdout and f"pid {proc.pid}" in status.stdout
        assert "ready" in status.stdout and "active runs 0" in status.stdout
        data = json.loads(run_cli(tmp_path, "status", "--json").stdout)["daemons"][0]
        assert data["pid"] == proc.pid and data["ready"] and data["active_runs"] == 0
        assert data["listen"] == f"unix://{sock}" and data["uptime_s"] >= 0
        logs = run_cli(tmp_path, "logs", "-n", "200")
        assert logs.returncode == 0 and "listening on" in logs.stdout
        stop = run_cli(tmp_path, "stop")
        assert stop.returncode == 0 and f"stopped relay daemon pid {proc.pid}" in stop.stdout
        assert proc.wait(20) == 0
        assert not sock.exists() and not list((tmp_path / "rt" / "relay").glob("daemon-*.json"))
        after = run_cli(tmp_path, "status")
        assert after.returncode == 1 and "no relay daemon is running" in after.stdout
    finally:
        daemon.stop()


def test_serve_without_listen_uses_the_kernel_side_socket_path(tmp_path):
    daemon = start_daemon(tmp_path, "--idle-timeout", "600")
    try:
        assert daemon.address == f"unix://{tmp_path / 'rt' / 'relay' / 'relay.sock'}"
    finally:
        assert daemon.stop() == 0


@pytest.mark.slow
def test_idle_timeout_exits_cleanly(tmp_path):
    daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/s/relay.sock", "--idle-timeout", "1")
    conn = daemon.connect()
    assert conn.request("GET", "/relay/healthz")[0] == 200
    conn.close()
    assert daemon.proc.wait(30) == 0
    assert not Path(daemon.socket_path).exists()
    assert "idle for 1 s" in (tmp_path / "data" / "relay" / "logs" / "daemon.log").read_text()


@pytest.mark.slow
def test_an_open_event_stream_keeps_it_alive_and_sigint_closes_it(tmp_path):
    daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/s/relay.sock", "--idle-timeout", "0.5")
    stream = daemon.connect()
    stream.send("GET", "/relay/events")
    while b"\r\n\r\n" not in stream.buf:
        stream._fill()
    assert stream.buf.startswith(b"HTTP/1.1 200")
    with pytest.raises(subprocess.TimeoutExpired):
        daemon.proc.wait(2)  # 4x the idle timeout: the stream counts as activity
    daemon.proc.send_signal(signal.SIGINT)
    assert daemon.proc.wait(20) == 0

    def closed() -> bool:
        try:
            stream._fill()
        except (ConnectionError, OSError):
            return True
        return False

    wait_for(closed, 10, "the event stream to close")
    stream.close()
    assert not Path(daemon.socket_path).exists()


def test_user_mistakes_are_one_line_exit_2(tmp_path, monkeypatch, capsys):
    # in-process: the same main() the console script runs
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    for args, needle in (
        (["serve", "--listen", "http://127.0.0.1:1"], "--listen takes"),
        (["serve", "--listen", "unix://relative.sock"], "--listen takes"),
        (["serve", "--listen", "tcp://127.0.0.1:99999"], "--listen takes"),
        (["serve", "--listen", "tcp://127.0.0.1"], "--listen takes"),
        (["serve", "--idle-timeout", "-1"], "--idle-timeout"),
        (["serve", "--listen", "unix:///tmp/x.sock", "--unauthenticated-metrics"], "tcp:// only"),
        (["serve", "--consent-timeout", "0"], "consent_timeout"),
        (["serve", "--config", str(tmp_path / "missing.json")], "cannot read"),
        (["logs", "--auth", "--data-dir", str(tmp_path / "none")], "no log at"),
        (["stop", "--pid", "999999"], "no relay daemon with pid"),
    ):
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0] and err[0].startswith("jupyter relay: "), (args, err)
