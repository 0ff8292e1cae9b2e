"""Helpers of the MCP tests: the shipped test MCP server over stdio, configs, pid checks."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from relay_jupyter.mcp.config import McpConfig, StdioServerConfig


def relay_test_server(name: str, notes: Path, *extra: str, timeout: float | None = None) -> StdioServerConfig:
    """The shipped test MCP server (relay_jupyter.testing.mcp_server) over stdio."""
    return StdioServerConfig(
        name=name,
        command=sys.executable,
        args=["-m", "relay_jupyter.testing.mcp_server", "--dir", str(notes), *extra],
        timeout=timeout,
    )




OLD_SDK_DIR = Path(os.environ.get("RELAY_OLD_MCP_DIR")
                   or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "relay-test" / "old-mcp")


def old_sdk_python(line: str) -> str:
    """The interpreter of the MCP SDK ``line`` venv (``tests/mcp/make_old_sdk_venvs.sh``), or skip."""
    import pytest

    python = OLD_SDK_DIR / f"mcp-{line}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"an MCP SDK {line} venv is not installed: tests/mcp/make_old_sdk_venvs.sh")
    return str(python)


def old_server(name: str, line: str) -> StdioServerConfig:
    """``tests/mcp/old_sdk_server.py`` on the MCP SDK ``line`` (1.9: protocol 2025-03-26, 1.12: 2025-06-18)."""
    return StdioServerConfig(name=name, command=old_sdk_python(line),
                             args=[str(Path(__file__).parent / "old_sdk_server.py")])


def config_of(*servers: StdioServerConfig) -> McpConfig:
    return McpConfig(servers={s.name: s for s in servers})


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` no longer exists (reaped, not a zombie)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return True
        if "\nState:\tZ" in state:
            # A zombie is dead but not yet reaped by us; the asyncio child watcher reaps soon.
            pass
        time.sleep(0.02)
    return False


