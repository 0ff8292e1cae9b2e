"""Real third-party MCP servers through the registry (issue 4, item 5).

- PyPI ``mcp-server-time`` and ``mcp-server-git`` over stdio (Python SDK: protocol 2026-07-28);
- npm ``@modelcontextprotocol/server-everything`` over stdio and over Streamable HTTP confined to
  127.0.0.1 (TypeScript SDK: protocol 2025-11-25);
- npm ``@modelcontextprotocol/server-filesystem``: its write tool is classified write and gated:
  denied -> the file is absent; approved -> the file is present.

A peer that is not installed skips with the command that installs it (``make peers`` / the
test extras); CI installs them, so these run there.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay_jupyter.core.budgets import BudgetLedger
from relay_jupyter.core.consent import StaticConsent
from relay_jupyter.core.errors import Code, GateRefusal
from relay_jupyter.core.gate import Gate
from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.memory import MemoryAuditSink, MemoryGrantStore, MemoryLedger
from relay_jupyter.core.pricing import Pricing
from relay_jupyter.core.types import ConsentDecision, Grant, ToolClass, ToolRequest
from relay_jupyter.mcp import McpRegistry
from relay_jupyter.mcp.config import HttpServerConfig, McpConfig, ServerConfig, StdioServerConfig

pytestmark = [pytest.mark.peer, pytest.mark.slow]

HERE = Path(__file__).parent
NPM = HERE / "node_modules" / "@modelcontextprotocol"
EVERYTHING = NPM / "server-everything" / "dist" / "index.js"
FILESYSTEM = NPM / "server-filesystem" / "dist" / "index.js"
LOOPBACK_ONLY = HERE / "loopback-only.cjs"


def _python_peer(name: str) -> str:
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed: pip install -e '.[test]' (or pip install {name})")
    return found


def _npm_peer(entry: Path) -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    if not entry.exists():
        pytest.skip(f"{entry.parent.parent.name} is not installed: run `make peers`")
    return node


def _registry(*servers: ServerConfig) -> McpRegistry:
    return McpRegistry(McpConfig(servers={s.name: s for s in servers}), shutdown_grace=1.0)


@pytest.mark.asyncio
async def test_mcp_server_time_over_stdio() -> None:
    cmd = _python_peer("mcp-server-time")
    async with asyncio.timeout(60):
        async with _registry(StdioServerConfig(name="time", command=cmd, args=["--local-timezone", "UTC"])) as reg:
            status = reg.status()[0]
            assert status.state == "connected", status.error
            assert status.protocol_version == "2026-07-28"
            assert {"time__get_current_time", "time__convert_time"} <= {s.name for s in reg.specs()}
            out = await reg.call("time__get_current_time", {"timezone": "UTC"})
            assert out["is_error"] is False and out["structured"]["timezone"] == "UTC"
            bad = await reg.call("time__get_current_time", {"timezone": "Not/AZone"})
            assert bad["is_error"] is True


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A repository with one commit and one untracked file."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    (repo / "a.txt").write_text("hello\n")
    subprocess.run(["git", "-C", str(repo), "add", "a.txt"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", "first commit"], check=True, env=env)
    (repo / "b.txt").write_text("untracked\n")
    return repo


@pytest.mark.asyncio
async def test_mcp_server_git_over_stdio(git_repo: Path) -> None:
    cmd = _python_peer("mcp-server-git")
    repo = git_repo
    async with asyncio.timeout(60):
        async with _registry(StdioServerConfig(name="git", command=cmd, args=["--repository", str(repo)])) as reg:
            specs = {s.name: s for s in reg.specs()}
            assert specs["git__git_commit"].tool_class == ToolClass.WRITE
            assert specs["git__git_reset"].tool_class == ToolClass.WRITE
            assert specs["git__git_status"].tool_class == ToolClass.WRITE  # until the user pins it
            status = await reg.call("git__git_status", {"repo_path": str(repo)})
            assert "b.txt" in status["content"] and status["is_error"] is False
            log = await reg.call("git__git_log", {"repo_path": str(repo)})
            assert "first commit" in log["content"]


@pytest.mark.asyncio
async def test_server_everything_over_stdio(monkeypatch: pytest.MonkeyPatch) -> None:
    node = _npm_peer(EVERYTHING)
    # A broker secret in our environment must not reach an MCP server (only a safe allowlist is inherited).
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-must-not-leak")
    async with asyncio.timeout(60):
        cfg = StdioServerConfig(name="ev", command=node, args=[str(EVERYTHING), "stdio"], env={"EV_MARK": "given"})
        async with _registry(cfg) as reg:
            status = reg.status()[0]
            assert status.state == "connected", status.error
            assert status.protocol_version == "2025-11-25"
            names = {s.name for s in reg.specs()}
            assert {"ev__echo", "ev__get-sum", "ev__get-tiny-image"} <= names
            assert (await reg.call("ev__echo", {"message": "hi"}))["content"] == "Echo: hi"
            image = await reg.call("ev__get-tiny-image", {})
            assert "[image: image/png" in image["content"] and "iVBOR" not in image["content"]
            env = await reg.call("ev__get-env", {})
            assert "sk-ant-must-not-leak" not in env["content"] and "given" in env["content"]


def _listening_addresses(port: int) -> list[str]:
    """Local addresses of LISTEN sockets on ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":
                found.append(address)
    return found


@pytest.fixture
def everything_http() -> Iterator[int]:
    """server-everything over Streamable HTTP, every listener forced onto 127.0.0.1; yields its port."""
    node = _npm_peer(EVERYTHING)
    proc = subprocess.Popen(
        [node, "--require", str(LOOPBACK_ONLY), str(EVERYTHING), "streamableHttp"],
        env={**os.environ, "PORT": "0"}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        port = None
        assert proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + 30
        buffer = b""
        while port is None and time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                chunk = os.read(proc.stderr.fileno(), 4096)
                if not chunk:
                    break
                buffer += chunk
                for line in buffer.decode(errors="replace").splitlines():
                    if line.startswith("RELAY_LISTENING "):
                        _, host, value = line.split()
                        assert host == "127.0.0.1"
                        port = int(value)
        sel.close()
        assert port is not None, f"server-everything did not start: {buffer[-500:]!r}"
        # Keep draining its log so it never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(proc.stderr.fileno(), 4096), b"")],
                         daemon=True).start()
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.asyncio
async def test_server_everything_over_streamable_http_on_loopback(everything_http: int) -> None:
    port = everything_http
    addresses = _listening_addresses(port)
    # 0100007F = 127.0.0.1 in /proc's little-endian hex; no wildcard (0.0.0.0 / ::) listener exists.
    assert addresses and all(a == "0100007F" for a in addresses), addresses
    cfg = HttpServerConfig(name="evh", url=f"http://127.0.0.1:{port}/mcp",
                           headers={"Authorization": "Bearer test-token"})
    async with asyncio.timeout(60):
        async with _registry(cfg) as reg:
            status = reg.status()[0]
            assert status.state == "connected", status.error
            assert status.protocol_version == "2025-11-25" and status.transport == "http"
            assert (await reg.call("evh__echo", {"message": "over http"}))["content"] == "Echo: over http"
            out = await reg.call("evh__get-sum", {"a": 2, "b": 40})
            assert "42" in out["content"]


@pytest.mark.asyncio
@pytest.mark.parametrize(("decision", "present"), [(ConsentDecision.DENY, False), (ConsentDecision.ALLOW, True)])
async def test_server_filesystem_write_is_gated(tmp_path: Path, decision: ConsentDecision, present: bool) -> None:
    node = _npm_peer(FILESYSTEM)
    root = tmp_path / "allowed"
    root.mkdir()
    target = root / "note.txt"
    audit = MemoryAuditSink()
    grants = GrantBook(MemoryGrantStore(), cache_ttl=0)
    grants.issue(Grant(origin="notebook:t.ipynb#k", tools=frozenset({"*"}), consent_id="test-connect"))
    gate = Gate(grants=grants, ledger=BudgetLedger(MemoryLedger()), audit=audit, pricing=Pricing(),
                consent_timeout=5.0)
    consent = StaticConsent(decision, answered_by="test")
    async with asyncio.timeout(60):
        async with _registry(StdioServerConfig(name="fs", command=node, args=[str(FILESYSTEM), str(root)])) as reg:
            spec = reg.spec("fs__write_file")
            assert spec is not None and spec.tool_class == ToolClass.WRITE
            assert spec.hints.get("destructive_hint") is True
            args = {"path": str(target), "content": "written by the agent"}
            request = ToolRequest(origin="notebook:t.ipynb#k", tool=spec, arguments=args, call_id="c1")

            async def execute() -> dict:
                return await reg.call(spec.name, args, expected_digest=spec.digest)

            if decision == ConsentDecision.DENY:
                with pytest.raises(GateRefusal) as info:
                    await gate.call_tool(request, execute, consent)
                assert info.value.code == Code.CONSENT_DENIED
            else:
                out = await gate.call_tool(request, execute, consent)
                assert out["is_error"] is False
            assert len(consent.asked) == 1, "a write always asks"
    assert target.exists() is present
    if present:
        assert target.read_text() == "written by the agent"
