#!/bin/sh
# The old-SDK MCP servers of tests/mcp/test_mcp_versions.py: one venv per MCP SDK release line.
#   mcp 1.9.x  -> protocol 2025-03-26        mcp 1.12.x -> protocol 2025-06-18
# pydantic 2.11: mcp 1.9-1.12 import a pydantic internal that 2.12 removed.
set -e
DIR="${RELAY_OLD_MCP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/relay-test/old-mcp}"
for v in 1.9 1.12; do
  python3 -m venv "$DIR/mcp-$v"
  PIP_CONSTRAINT= "$DIR/mcp-$v/bin/pip" install -q --constraint /dev/null "mcp==$v.*" "pydantic==2.11.*"
done
echo "old MCP SDK venvs in $DIR"
