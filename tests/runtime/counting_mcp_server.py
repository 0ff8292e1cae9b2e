"""The test MCP server (``relay_jupyter.testing.mcp_server``) over stdio, whose ``hang`` tool also
appends one line to ``<dir>/hang.calls`` when it starts: the SIGKILL test counts executions with it
(a re-executed call after a broker restart would add a line).

    python tests/runtime/counting_mcp_server.py --dir D
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import anyio
from mcp.types import ToolAnnotations

from relay_jupyter.testing.mcp_server import MAX_HANG, make_server

CALLS_FILE = "hang.calls"


def main(argv: list[str] | None = None) -> int:
    """Serve the test server over stdio with a counting ``hang``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True, help="notes directory (hang.calls is written there)")
    args = parser.parse_args(argv)
    notes = Path(args.dir)
    server = make_server(notes)
    server.remove_tool("hang")

    async def hang(seconds: float = 3600.0) -> str:
        """Sleep for `seconds` before answering (to test call timeouts and cancellation)."""
        # O_APPEND + one write: a line per execution even if two ever raced
        fd = os.open(notes / CALLS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"{os.getpid()} {seconds}\n".encode())
        finally:
            os.close(fd)
        await anyio.sleep(min(max(seconds, 0.0), MAX_HANG))
        return f"slept {seconds} s"

    server.add_tool(hang, name="hang", annotations=ToolAnnotations(read_only_hint=True))
    server.run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
