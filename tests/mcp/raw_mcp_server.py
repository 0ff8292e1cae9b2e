"""A hand-written stdio MCP server (JSON-RPC lines, no SDK): it says what a test tells it to, lies included.

    python tests/mcp/raw_mcp_server.py --version V [--elicit FILE] [--elicit-count N] [--structured]
                                       [--log FILE]

Written against the MCP specification's stdio transport and lifecycle (``initialize`` →
``notifications/initialized``, ``tools/list``, ``tools/call``): whatever version the client offers,
it answers ``initialize`` with ``--version`` (a real old server answers with its own newest version;
a lying one with anything). ``server/discover`` gets ``-32601`` (method not found), as from a
handshake-era server. Tools:

- ``echo(text)``: the text; with ``--structured`` also ``structuredContent`` (which a 2025-03-26
  server cannot send);
- ``ask()``: sends ``elicitation/create`` ``--elicit-count`` times (default 1) with the message and
  requested schema of ``--elicit`` (JSON ``{"message", "requestedSchema"}``), then answers with the
  client's replies as JSON text.

``--log FILE`` appends every message received (one JSON line each): what the client sent.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TOOLS = [
    {"name": "echo", "description": "Echo the text.", "inputSchema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
     "annotations": {"readOnlyHint": True}},
    {"name": "ask", "description": "Ask the user something.", "inputSchema": {"type": "object", "properties": {}}},
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--version", required=True)
    parser.add_argument("--elicit")
    parser.add_argument("--elicit-count", type=int, default=1)
    parser.add_argument("--structured", action="store_true")
    parser.add_argument("--log")
    args = parser.parse_args()
    elicit = json.loads(Path(args.elicit).read_text()) if args.elicit else {
        "message": "Your name?", "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}
    next_id = 1000

    def send(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    def receive() -> dict[str, Any] | None:
        line = sys.stdin.readline()
        if not line:
            return None
        message = json.loads(line)
        if args.log:
            with open(args.log, "a") as fh:
                fh.write(json.dumps(message) + "\n")
        return message

    def wait_reply(request_id: int) -> dict[str, Any] | None:
        while True:
            message = receive()
            if message is None:
                return None
            if message.get("id") == request_id and "method" not in message:
                return message
            if "method" in message and "id" in message:  # a request meanwhile (ping …): answer empty
                send({"jsonrpc": "2.0", "id": message["id"], "result": {}})

    while True:
        message = receive()
        if message is None:
            return 0
        method, mid = message.get("method"), message.get("id")
        if mid is None:
            continue  # notifications
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": args.version, "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "raw", "version": "0.0.1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            name = message["params"]["name"]
            if name == "echo":
                result: dict[str, Any] = {"content": [{"type": "text", "text": message["params"]["arguments"]["text"]}]}
                if args.structured:
                    result["structuredContent"] = {"smuggled": True}
                send({"jsonrpc": "2.0", "id": mid, "result": result})
            elif name == "ask":
                replies = []
                for _ in range(args.elicit_count):
                    next_id += 1
                    send({"jsonrpc": "2.0", "id": next_id, "method": "elicitation/create", "params": elicit})
                    reply = wait_reply(next_id)
                    if reply is None:
                        return 0
                    replies.append(reply.get("result") or {"error": reply.get("error")})
                send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": json.dumps(replies)}]}})
            else:
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": f"no tool {name}"}})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    raise SystemExit(main())
