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


