#!/bin/sh
# The old-SDK MCP servers of tests/mcp/test_mcp_versions.py: one venv per MCP SDK release line.
#   mcp 1.9.x  -> protocol 2025-03-26        mcp 1.12.x -> protocol 2025-06-18
# pydantic 2.11: mcp 1.9-1.12 import a pydantic internal that 2.12 removed.
# The venvs are made without pip and filled by the project venv's pip (`pip --python`): a CI machine's
# `python3 -m venv` does not always seed pip (ensurepip missing or a distribution python), and the
# project venv's pip is there whenever `make install-test` has run. PYTHON / PIP name them.
set -e
DIR="${RELAY_OLD_MCP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/relay-test/old-mcp}"
PYTHON="${PYTHON:-python3}"
PIP="${PIP:-$PYTHON -m pip}"
for v in 1.9 1.12; do
  rm -rf "$DIR/mcp-$v"
  "$PYTHON" -m venv --without-pip "$DIR/mcp-$v"
  PIP_CONSTRAINT= $PIP --python "$DIR/mcp-$v/bin/python" install -q --constraint /dev/null \
    "mcp==$v.*" "pydantic==2.11.*"
  "$DIR/mcp-$v/bin/python" -c "import mcp.server.fastmcp"
done
echo "old MCP SDK venvs in $DIR"
