"""A push through a real ``jupyter relay serve`` (which sets umask 077 for its own files) keeps an
existing target's mode and gives a new file the umask the user started the daemon with (issue 12.9)."""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.types import Grant
from relay_jupyter.storage.paths import ensure_private_dir
from relay_jupyter.storage.sqlite import Store
from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
from daemon_harness import Daemon, env_for, relay_cmd, wait_for  # noqa: E402

pytestmark = pytest.mark.slow
KEY = "sk-ant-test-modes-0123456789"


def start_in(root: Path, home: Path, cfg: Path, umask: int) -> Daemon:
    """``serve`` started by a user whose umask is ``umask``, in ``root`` (its Jupyter root)."""
    ensure_private_dir(home / "sock")
    with open(home / "daemon.stderr", "ab") as err:
        proc = subprocess.Popen(relay_cmd("serve", "--listen", f"unix://{home}/sock/relay.sock", "--config", str(cfg)),
                                env=env_for(home), cwd=root, stdout=subprocess.PIPE, stderr=err, umask=umask)
    out = b""
    deadline = time.monotonic() + 60
    while b"\n" not in out:
        assert time.monotonic() < deadline and proc.poll() is None, (home / "daemon.stderr").read_text()[-2000:]
        if select.select([proc.stdout], [], [], 0.5)[0]:
            out += os.read(proc.stdout.fileno(), 4096)
    return Daemon(proc=proc, root=home, address=out.split(b"\n", 1)[0].decode().rsplit(" ", 1)[1], stdout=out)


def rpc(daemon: Daemon, method: str, params: dict) -> dict:
    conn = daemon.connect()
    conn.sock.settimeout(60)
    try:
        reply = conn.rpc(method, params, {"X-Relay-Client": "t"})
    finally:
        conn.close()
    assert "error" not in reply, reply
    return reply["result"]


@pytest.mark.parametrize("umask,new_mode", [(0o022, 0o644), (0o002, 0o664)])
def test_a_daemon_push_keeps_modes_and_uses_the_users_umask(tmp_path: Path, umask: int, new_mode: int) -> None:
    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    (root / "report.md").write_text("old\n")
    os.chmod(root / "report.md", 0o644)
    (root / "script.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "script.sh", 0o750)
    data = ensure_private_dir(tmp_path / "data")
    with Store.open(data / "relay.db") as store:
        GrantBook(store).issue(Grant(origin="daemon:t", tools=frozenset({"*"}), models=frozenset({"*"}),
                                     consent_id="terminal"))
    with FakeAnthropic(api_key=KEY) as fake:
        cfg = tmp_path / "broker.json"
        cfg.write_text(json.dumps({"data_dir": str(data), "anthropic_base_url": fake.base_url,
                                   "anthropic_api_key": KEY, "default_model": "claude-test-1"}))
        daemon = start_in(root, home, cfg, umask)
        try:
            calls = [tool_use("scratch_write", {"path": f"f{i}", "content": f"new {i}\n"}) for i in range(3)]
            calls += [tool_use("scratch_push", {"path": "f0", "target": "report.md"}),
                      tool_use("scratch_push", {"path": "f1", "target": "script.sh"}),
                      tool_use("scratch_push", {"path": "f2", "target": "made/by/agent.txt"})]
            fake.enqueue(Reply(*calls[:3]), Reply(calls[3]), Reply(calls[4]), Reply(calls[5]), Reply(text("done")))
            run_id = rpc(daemon, "run.start", {"conversation": "c", "prompt": "write", "mode": "full"})["run_id"]
            wait_for(lambda: rpc(daemon, "runs.get", {"run_id": run_id})["run"]["state"] == "done", timeout=60,
                     what="the run")
            assert (root / "made" / "by" / "agent.txt").read_text() == "new 2\n"
            assert stat.S_IMODE((root / "report.md").stat().st_mode) == 0o644
            assert stat.S_IMODE((root / "script.sh").stat().st_mode) == 0o750
            assert stat.S_IMODE((root / "made" / "by" / "agent.txt").stat().st_mode) == new_mode
            assert stat.S_IMODE((root / "made").stat().st_mode) == new_mode | 0o111
            # the daemon's own files stay private (077)
            assert stat.S_IMODE(os.stat(home / "sock" / "relay.sock").st_mode) & 0o077 == 0
        finally:
            daemon.proc.send_signal(signal.SIGTERM)
            daemon.proc.wait(20)
