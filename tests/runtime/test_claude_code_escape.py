"""What a ``Bash`` command of the claude-code engine can leave behind (issue 17 Deliver 3, "its children are
killed"): the engine's real run directory (``ClaudeCodeEngine._prepare``: the environment built from nothing,
the launcher script) and the real launcher (``engines/claude_launch.py``), with a shell script standing in for
the ``claude`` CLI (``cli_path``), so no CLI and no network are needed.

Contained, and checked here: ``setsid -f`` (a session of its own, its parent gone at once), a double fork
(``( … & )``), ``nohup … &`` — each alive when the "CLI" exits, none after the launcher's end; the same when the
SDK terminates the launcher (SIGTERM) while the CLI still runs. Not reachable from the environment: the user's
service manager (``systemd-run --user``: no user bus — ``XDG_RUNTIME_DIR`` and ``DBUS_SESSION_BUS_ADDRESS``
point at an empty directory of the run's own). What is *not* contained (a command that names the real bus,
``at``, ``cron``, an already-running ``tmux`` server) is documented in docs/engines.md and docs/security.md."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from relay_jupyter.engines.claude_code import ClaudeCodeEngine

KEY = "sk-relay-run-key-escape-test-0123456789"

SLEEPER = ("/usr/bin/python3 -c 'import os, signal, sys, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
           "open(sys.argv[1] + \".tmp\", \"w\").write(str(os.getpid())); os.rename(sys.argv[1] + \".tmp\", sys.argv[1]); "
           "time.sleep(600)' {}")

FAKE_CLI = """#!/bin/sh
out={out}
env > "$out/env.txt"
systemd-run --user --scope /bin/true > /dev/null 2> "$out/user.err"; echo "$?" > "$out/user.rc"
setsid -f {s1} > /dev/null 2>&1 < /dev/null
( {s2} > /dev/null 2>&1 < /dev/null & )
nohup {s3} > /dev/null 2>&1 < /dev/null &
n=0
while [ ! -e "$out/p1" ] || [ ! -e "$out/p2" ] || [ ! -e "$out/p3" ]; do
  n=$((n + 1)); [ "$n" -gt 600 ] && exit 3
  sleep 0.05
done
echo started > "$out/started"
{tail}
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _launch(tmp_path: Path, tail: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "fake-claude"
    script.write_text(FAKE_CLI.format(out=out, s1=SLEEPER.format(out / "p1"), s2=SLEEPER.format(out / "p2"),
                                      s3=SLEEPER.format(out / "p3"), tail=tail))
    script.chmod(0o700)
    engine = ClaudeCodeEngine(SimpleNamespace(options={"cli_path": str(script)}))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    wrapper = engine._prepare(run_dir, SimpleNamespace(base_url="http://127.0.0.1:9/relay/anthropic", key=KEY))
    # the broker's own environment has secrets the CLI must not get
    env = {**os.environ, "ANTHROPIC_API_KEY": "sk-ant-broker-secret-xyz", "JUPYTER_TOKEN": "jupyter-secret-xyz"}
    proc = subprocess.Popen([str(wrapper), "--print"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    return proc, out, run_dir


def _pids(out: Path) -> list[int]:
    return [int((out / f"p{n}").read_text()) for n in (1, 2, 3)]


@pytest.mark.skipif(not (shutil.which("setsid") and os.path.exists("/usr/bin/python3")), reason="needs setsid, python3")
def test_daemonised_children_die_with_the_cli_and_no_user_bus_is_reachable(tmp_path: Path) -> None:
    proc, out, run_dir = _launch(tmp_path, "exit 0")
    assert proc.wait(120) == 0, proc.stderr.read() if proc.stderr else ""
    assert (out / "started").exists()
    pids = _pids(out)
    assert len(set(pids)) == 3
    assert [p for p in pids if _alive(p)] == []  # each one left the CLI's session or parent, none survived
    # the environment: built from nothing, and no way to the user's service manager
    env = dict(line.split("=", 1) for line in (out / "env.txt").read_text().splitlines() if "=" in line)
    assert "sk-ant-broker-secret-xyz" not in json.dumps(env) and "jupyter-secret-xyz" not in json.dumps(env)
    assert env["XDG_RUNTIME_DIR"] == str(run_dir / "xdg") and env["DBUS_SESSION_BUS_ADDRESS"].startswith("unix:path=")
    if shutil.which("systemd-run", path="/usr/local/bin:/usr/bin:/bin"):
        assert (out / "user.rc").read_text().strip() != "0", (out / "user.err").read_text()
        assert "bus" in (out / "user.err").read_text().lower()


@pytest.mark.skipif(not (shutil.which("setsid") and os.path.exists("/usr/bin/python3")), reason="needs setsid, python3")
def test_the_sdks_terminate_kills_the_cli_and_everything_it_daemonised(tmp_path: Path) -> None:
    proc, out, _ = _launch(tmp_path, "exec /usr/bin/python3 -c 'import time; time.sleep(600)'")
    deadline = time.monotonic() + 120
    while not (out / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the fake CLI never started its children"
        time.sleep(0.05)
    pids = _pids(out)
    assert all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGTERM)  # what the SDK's close does
    assert proc.wait(60) == 128 + signal.SIGTERM
    assert [p for p in pids if _alive(p)] == []
