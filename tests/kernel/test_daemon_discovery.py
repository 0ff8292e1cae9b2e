"""Outside a relay-enabled Jupyter server and with no RELAY_URL, the first %%agent cell starts the
user's daemon on a Unix socket in the Jupyter runtime directory, and a second kernel shares it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import execute, start_kernel, text_of

pytestmark = pytest.mark.slow


def _click(kc: Any, label: str, clicked: list[str]) -> Any:
    def observe(msg: dict[str, Any]) -> None:
        state = msg["content"].get("data", {}).get("state", {}) if msg["msg_type"] == "comm_open" else {}
        if state.get("_model_name") == "ButtonModel" and state.get("description") == label:
            clicked.append(msg["content"]["comm_id"])
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": msg["content"]["comm_id"], "data": {
                "method": "custom", "content": {"event": "click"}}}))

    return observe


def test_first_cell_starts_the_daemon_and_kernels_share_it(tmp_path: Path) -> None:
    env = {"JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    kernels = []
    try:
        for _ in range(2):
            km, kc = start_kernel({}, str(tmp_path))
            execute(kc, "import os\nos.environ.update(" + repr(env) + ")\n%load_ext relay_jupyter")
            kernels.append((km, kc))
        (_, first), (_, second) = kernels
        clicked: list[str] = []
        reply, msgs = execute(first, "%%agent\nhello", on_iopub=_click(first, "Connect", clicked), timeout=90)
        assert reply["status"] == "ok", text_of(msgs)
        socket_path = tmp_path / "rt" / "relay" / "relay.sock"
        assert socket_path.exists() and oct(socket_path.parent.stat().st_mode & 0o777) == "0o700"
        reply, msgs = execute(second, "%%agent\nhello too", on_iopub=_click(second, "Connect", clicked),
                              timeout=90)
        assert reply["status"] == "ok", text_of(msgs)
        code = ("s = get_ipython().magics_manager.registry['AgentMagics'].session\n"
                "print(s.client.endpoint.url)")
        assert f"unix://{socket_path}" in text_of(execute(second, code)[1])
    finally:
        for km, kc in kernels:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        # stop the daemon this test started, through its own command
        subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "stop"], env={**os.environ, **env},
                       capture_output=True, timeout=30, check=False)
