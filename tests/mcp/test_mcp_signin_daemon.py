"""OAuth sign-in for the standalone daemon (issue 20 item 2): ``jupyter relay mcp-signin SERVER`` at a terminal.

A real daemon subprocess (``jupyter relay serve``) whose mcp.json names the local OAuth-protected MCP server of the
sign-in tests (``tests/mcp/oauth_mcp_server.py``: the MCP SDK's server auth, a page that approves at once), on
127.0.0.1. The daemon says in one line how to sign in (and refuses ``mcp.sign_in``: it has no redirect route);
``jupyter relay mcp-signin remote`` (a real subprocess) prints the link and listens on its own loopback redirect;
the "browser" (httpx2) opens the link and is sent back to it; a forged or replayed state lands nothing; the CLI
exchanges the code and stores the token in the 0600 file the daemon reads; the running daemon then connects the
server with that token (its tools listed). No token in the CLI's output, the daemon's log or its audit.
"""

from __future__ import annotations

import json
import os
import select
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from oauth_mcp_server import OAuthMcpServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
from daemon_harness import Daemon, env_for, relay_cmd, run_cli, start_daemon  # noqa: E402

pytestmark = pytest.mark.slow


def _tools(daemon: Daemon) -> list[dict[str, Any]]:
    try:
        return daemon.rpc("tools.list", {})["result"]["tools"]
    except TimeoutError:  # a loaded machine: ask again
        return []


def _log(daemon: Daemon) -> str:
    return "".join(p.read_text(errors="replace") for p in (daemon.data_dir / "logs").glob("*")) + (
        daemon.root / "daemon.stderr").read_text(errors="replace")


def _wait(predicate: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _line(proc: subprocess.Popen[bytes], startswith: str, timeout: float = 60.0) -> tuple[str, str]:
    """Read the CLI's stdout (raw, unbuffered) until a line starting with ``startswith``; returns (that line,
    everything read)."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in seen.decode(errors="replace").splitlines(keepends=True):
            if line.startswith(startswith) and line.endswith("\n"):
                return line.strip(), seen.decode(errors="replace")
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
    raise AssertionError(f"no line starting with {startswith!r}: {seen!r} {proc.poll()}")


def test_the_daemon_signs_in_through_the_terminal_command(tmp_path: Path) -> None:
    with OAuthMcpServer() as oauth:
        (tmp_path / "cfg").mkdir()
        (tmp_path / "cfg" / "mcp.json").write_text(json.dumps({"mcpServers": {"remote": {"url": oauth.url}}}))
        daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0")
        cli: subprocess.Popen[bytes] | None = None
        try:
            # the daemon never waits for a person: one line saying how to sign in
            _wait(lambda: "jupyter relay mcp-signin remote" in _log(daemon), "the needs-sign-in line")
            needs = next(line for line in _log(daemon).splitlines() if "jupyter relay mcp-signin remote" in line)
            assert "needs sign-in (HTTP 401, OAuth): sign in at a terminal with: jupyter relay mcp-signin remote" \
                in needs and "could not be reached" not in needs
            listed = daemon.rpc("tools.list", {})["result"]["tools"]
            assert not [t for t in listed if t["name"].startswith("remote__")]
            refused = daemon.rpc("mcp.sign_in", {"server": "remote"})["error"]
            assert "jupyter relay mcp-signin remote" in refused["message"] and "\n" not in refused["message"]
            # no side-panel sign-in list here: the daemon signs in at a terminal
            assert daemon.rpc("mcp.sign_ins", {})["result"] == {"servers": []}
            assert oauth.provider.authorized == 0

            cli = subprocess.Popen(relay_cmd("mcp-signin", "remote", "--timeout", "60"), env=env_for(tmp_path),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            url, said = _line(cli, "http")
            assert "Sign in to the MCP server remote on its authorization page (127.0.0.1)" in said
            assert "code_challenge_method=S256" in url and "code_verifier" not in url
            with httpx2.Client(follow_redirects=False, timeout=10, trust_env=False) as browser:
                approved = browser.get(url)
                assert approved.status_code in (302, 303, 307), approved.text
                back = approved.headers["location"]
                assert back.startswith("http://127.0.0.1:") and "/callback?" in back
                base = back.split("?", 1)[0]
                assert browser.get(base, params={"code": "forged", "state": "forged"}).status_code == 400
                landed = browser.get(back)
                assert landed.status_code == 200 and "Signed in to remote" in landed.text
                assert landed.headers.get("referrer-policy") == "no-referrer"
                assert browser.get(back).status_code == 400  # each state once
            raw_out, raw_err = cli.communicate(timeout=60)
            out, err = raw_out.decode(errors="replace"), raw_err.decode(errors="replace")
            assert cli.returncode == 0, (said, out, err)
            assert "✓ signed in to remote: 1 tools" in out

            # the token is in the daemon's 0600 store, and the running daemon connects with it
            oauth_dir = daemon.data_dir / "mcp-oauth"
            files = list(oauth_dir.glob("*.json"))
            assert len(files) == 1 and stat.S_IMODE(os.stat(files[0]).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(oauth_dir).st_mode) == 0o700
            _wait(lambda: any(t["name"] == "remote__whoami" for t in _tools(daemon)),
                  "the daemon to list the signed-in server's tool")
            assert oauth.provider.tokens_issued == 1 and oauth.provider.authorized == 1
        finally:
            if cli is not None and cli.poll() is None:
                cli.kill()
                cli.wait(5)
            daemon.stop()
        access = next(iter(oauth.provider.access))
        refresh = next(iter(oauth.provider.refresh))
        audit = "".join(p.read_text() for p in daemon.data_dir.glob("audit*"))
        for secret in (access, refresh):
            assert secret in files[0].read_text()
            assert secret not in said + out + err and secret not in _log(daemon) and secret not in audit
    assert run_cli(tmp_path, "mcp-signin", "nope").returncode == 2
