"""relay's logs go through the Jupyter server's logger (issue 19 item 3): a warning carries the server's
format (``[W <time> relay_jupyter.…]``) rather than printing bare, and ``--debug`` shows relay's debug lines.
A real ``jupyter server`` subprocess with no model key (so the broker warns that it uses the demo backend)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_log(tmp_path: Path, *flags: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER_", "RELAY_", "ANTHROPIC_", "OPENAI_")) and k != "CI"}
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
    port = _free_port()
    log_path = tmp_path / f"server{len(flags)}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
                                 "--ip", "127.0.0.1", "--port", str(port), "--IdentityProvider.token=t", *flags],
                                cwd=tmp_path, env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/relay/healthz?token=t", timeout=5):
                        break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise AssertionError(log_path.read_text(errors="replace")[-3000:]) from None
                    time.sleep(0.3)
        finally:
            proc.terminate()
            proc.wait(30)
    return log_path.read_text(errors="replace")


def test_relay_warnings_use_the_server_format_and_debug_shows_relay(tmp_path: Path) -> None:
    text = _server_log(tmp_path)
    warning = [ln for ln in text.splitlines() if "using the demo backend" in ln]
    assert warning and re.match(r"^\[W \d{4}-\d\d-\d\d [\d:.]+ relay_jupyter\.", warning[0]), warning or text[-2000:]
    assert not [ln for ln in text.splitlines() if "relay_jupyter" in ln and ln.startswith("[D ")]

    debug = _server_log(tmp_path, "--debug")
    assert re.search(r"^\[D [^\]]* relay_jupyter\.server\.app\] relay: broker open", debug, re.M), debug[-3000:]
