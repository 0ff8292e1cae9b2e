"""A running kernel renews its daemon credential after a kernel-key rotation (issue 19 leftover; docs/daemon.md
"Rotating the kernel key"): on the daemon's 401 it registers again, once, where it registered before, and keeps
the new credential only when the daemon binds it to the same origin. So ``jupyter relay token rotate --kernel-key``
— even ``--grace 0``, for a key that leaked — no longer breaks open notebooks that know their path; a kernel without
a path (a fresh origin per registration) cannot carry its grant over and says to restart.

Real parts: ``jupyter relay serve`` on a Unix socket (demo backend), real ipykernel kernels started with
jupyter_client, the real CLI for grants and the rotation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import Daemon, run_cli, start_daemon
from jupyter_client.manager import start_new_kernel

pytestmark = pytest.mark.slow


def _kernel_env(tmp_path: Path, daemon: Daemon, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JPY_"))}
    env.update(RELAY_URL=daemon.address, JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), CI="1", **extra)
    return env


def _run(kc: Any, code: str) -> str:
    """Everything ``code`` showed: streams, displays (text/plain) and errors."""
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(content.get("text", ""))
        elif msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            out.append(content.get("data", {}).get("text/plain", ""))
        elif msg["msg_type"] == "error":
            out.append(f"{content.get('ename')}: {content.get('evalue')}")

    kc.execute_interactive(code, output_hook=hook, timeout=120)
    return "\n".join(out)


def _registrations(daemon: Daemon, origin_prefix: str) -> int:
    log = (daemon.data_dir / "logs" / "daemon.log").read_text()
    return sum(1 for line in log.splitlines() if f"kernel registered as {origin_prefix}" in line)


def test_a_kernel_key_rotation_without_grace_does_not_break_a_running_notebook(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/s/relay.sock")
    km = kc = None
    try:
        origin = "daemon:kernel:weekly.ipynb"
        assert run_cli(tmp_path, "grants", "add", origin, "--tools", "list_variables", "--models", "*").returncode == 0
        km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120,
                                  env=_kernel_env(tmp_path, daemon, RELAY_NOTEBOOK="weekly.ipynb"))
        first = _run(kc, "%load_ext relay_jupyter\n")
        first += _run(kc, "%%agent\nhello")
        assert "[demo]" in first, first
        assert _registrations(daemon, origin) == 1

        rotated = run_cli(tmp_path, "token", "rotate", "--kernel-key", "--grace", "0")
        assert rotated.returncode == 0 and "refused from now on" in rotated.stdout, rotated.stderr

        again = _run(kc, "%%agent\nhello again")
        assert "[demo]" in again and "refused this kernel's credential" not in again, again
        assert _registrations(daemon, origin) == 2  # it registered again: the same origin, under the new key
        # its runs and audit rows are still the notebook's own
        audit = (daemon.data_dir / "audit-daemon.jsonl").read_text()
        assert audit.count(f'"{origin}"') >= 2 and "anon-" not in audit
    finally:
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            km.shutdown_kernel(now=True)
        daemon.stop()


def test_a_kernel_without_a_notebook_path_cannot_carry_its_grant_over_a_rotation(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/s/relay.sock")
    km = kc = None
    try:
        km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120, env=_kernel_env(tmp_path, daemon))
        first = _run(kc, "%load_ext relay_jupyter\ng = relay.connect([], models=['*'])\nprint('origin', g['origin'])")
        assert "daemon:kernel:anon-" in first, first
        assert "[demo]" in _run(kc, "%%agent\nhello")

        assert run_cli(tmp_path, "token", "rotate", "--kernel-key", "--grace", "0").returncode == 0
        again = _run(kc, "%%agent\nhello again")
        # a new registration is a new anonymous origin without the grant: not taken, the cell says restart
        assert "refused this kernel's credential" in again and "restart the kernel" in again, again
        assert "[demo]" not in again
        assert _registrations(daemon, "daemon:kernel:anon-") == 2
    finally:
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            km.shutdown_kernel(now=True)
        daemon.stop()


def test_a_running_kernel_picks_up_a_rotated_tcp_token_from_the_token_file(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0")
    km = kc = None
    try:
        origin = "daemon:kernel:daily.ipynb"
        assert run_cli(tmp_path, "grants", "add", origin, "--tools", "list_variables", "--models", "*").returncode == 0
        env = _kernel_env(tmp_path, daemon, RELAY_NOTEBOOK="daily.ipynb")
        env["RELAY_URL"] = f"http://127.0.0.1:{daemon.port}/relay/"  # the token comes from the daemon's token file
        km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120, env=env)
        assert "[demo]" in _run(kc, "%load_ext relay_jupyter\n") + _run(kc, "%%agent\nhello")
        old = daemon.token()

        assert run_cli(tmp_path, "token", "rotate").returncode == 0
        assert daemon.token() != old
        again = _run(kc, "%%agent\nhello again")
        assert "[demo]" in again and "refused" not in again, again
        assert _registrations(daemon, origin) == 2  # registered again with the token read from the file
    finally:
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            km.shutdown_kernel(now=True)
        daemon.stop()
