"""The gated MCP gateway on the standalone daemon (``jupyter relay serve``): ``/relay/mcp``, the same path and the
same tokens as ``{base_url}relay/mcp`` in the Jupyter server (docs/mcp.md, "The gated MCP gateway").

A real daemon subprocess with the shipped test MCP server (stdio, from ``mcp.json``) and a grant for
``daemon:agent`` made at the terminal; the official ``mcp`` SDK client holds a ``jupyter relay mcp-token --client
agent`` token. It is offered only the granted tools; a pinned read runs and is audited (``mcpgw_`` id); a write
waits for consent, which the daemon client ``agent`` answers over RPC (another client name cannot); denied writes
nothing, allowed writes. The daemon token, a wrong token, none, a revoked one: the gateway's one 401 (the daemon
token never stands in for a gateway token). A Jupyter notebook's ``--notebook`` token, whose cards only a side
panel could answer, is refused with one line (403) instead of timing out on every write. The token is in no daemon
log line or audit record.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
from daemon_harness import Daemon, run_cli, start_daemon
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

GRANTED = ["t__echo", "t__write_note"]


def _rpc(daemon: Daemon, client: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    conn = daemon.connect()
    try:
        return conn.rpc(method, params, {"Authorization": f"Bearer {daemon.token()}", "X-Relay-Client": client})
    finally:
        conn.close()


async def _card(daemon: Daemon, client: str) -> dict[str, Any]:
    """The one pending permission request ``client`` may answer (state in another process: poll RPC)."""
    async with asyncio.timeout(30):
        while True:
            pending = (await asyncio.to_thread(_rpc, daemon, client, "permission.pending", {}))["result"]["requests"]
            if pending:
                assert len(pending) == 1, pending
                return pending[0]
            await asyncio.sleep(0.05)


def _audit(daemon: Daemon) -> list[dict[str, Any]]:
    return [json.loads(line) for path in daemon.data_dir.glob("audit*.jsonl")
            for line in path.read_text().splitlines() if line.strip()]


def _client(url: str, token: str) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=60))
    return Client(streamable_http_client(url, http_client=http))


async def test_the_daemon_serves_the_gateway_with_gateway_tokens_only(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "mcp.json").write_text(json.dumps({"mcpServers": {"t": {
        "command": sys.executable, "args": ["-m", "relay_jupyter.testing.mcp_server", "--dir", str(notes)]}}}))
    for args in (("grants", "add", "daemon:agent", "--tools", ",".join(GRANTED), "--models", "*"),
                 ("tools", "pin", "t__echo", "read")):
        done = run_cli(tmp_path, *args)
        assert done.returncode == 0, done.stderr
    minted = run_cli(tmp_path, "mcp-token", "--client", "agent", "--label", "sdk")
    assert minted.returncode == 0, minted.stderr
    secret = next(w for line in minted.stdout.splitlines() for w in line.split() if w.startswith("relay-mcp-"))
    assert "daemon:agent" in minted.stdout
    # a Jupyter notebook's token (its cards go to a side panel, which the daemon has not): refused in one line
    notebook = run_cli(tmp_path, "mcp-token", "--notebook", "nb.ipynb")
    assert notebook.returncode == 0, notebook.stderr
    nb_secret = next(w for line in notebook.stdout.splitlines() for w in line.split() if w.startswith("relay-mcp-"))
    other = run_cli(tmp_path, "mcp-token", "--client", "bad name!")
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1

    daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0")
    try:
        url = f"http://127.0.0.1:{daemon.port}/relay/mcp"
        async with asyncio.timeout(120), _client(url, secret) as client:
            names: list[str] = []
            while names != GRANTED:  # the daemon connects its MCP servers after it starts listening
                names = sorted(t.name for t in (await client.list_tools()).tools)
                assert set(names) <= set(GRANTED), names  # never an ungranted tool (t__delete_note, t__add, ...)
                if names != GRANTED:
                    await asyncio.sleep(0.1)

            echoed = await client.call_tool("t__echo", {"text": "via the daemon"})
            assert not echoed.is_error and echoed.content[0].text == "via the daemon"

            # a write waits for the card of the daemon client "agent"; another client sees none, cannot answer
            denied = asyncio.ensure_future(client.call_tool("t__write_note", {"path": "n.txt", "text": "no"}))
            card = await _card(daemon, "agent")
            assert card["tool"] == "t__write_note" and card["origin"] == "daemon:agent"
            assert not denied.done()
            assert (await asyncio.to_thread(_rpc, daemon, "intruder", "permission.pending", {}))["result"]["requests"] == []
            stranger = await asyncio.to_thread(_rpc, daemon, "intruder", "permission.answer",
                                               {"request_id": card["request_id"], "decision": "allow"})
            assert "error" in stranger and not denied.done()
            answered = await asyncio.to_thread(_rpc, daemon, "agent", "permission.answer",
                                               {"request_id": card["request_id"], "decision": "deny"})
            assert answered["result"]["decision"] == "deny"
            result = await denied
            assert result.is_error and result.content[0].text.startswith("refused (CONSENT_DENIED)")
            assert not (notes / "n.txt").exists()

            allowed = asyncio.ensure_future(client.call_tool("t__write_note", {"path": "n.txt", "text": "yes"}))
            card = await _card(daemon, "agent")
            await asyncio.to_thread(_rpc, daemon, "agent", "permission.answer",
                                    {"request_id": card["request_id"], "decision": "allow"})
            result = await allowed
            assert not result.is_error and (notes / "n.txt").read_text() == "yes"

            refused = await client.call_tool("t__delete_note", {"path": "n.txt"})
            assert refused.is_error and refused.content[0].text.startswith("refused (") and (notes / "n.txt").exists()

        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        async with httpx2.AsyncClient(timeout=10) as raw:
            answers = [await raw.post(url, json=body, headers=headers) for headers in (
                {"Authorization": f"Bearer {daemon.token()}"},  # the daemon token is not a gateway token
                {"Authorization": "Bearer relay-mcp-wrong"}, {})]
            assert [a.status_code for a in answers] == [401, 401, 401]
            assert len({a.content for a in answers}) == 1 and b"daemon token" not in answers[0].content
            assert (await raw.post(url + f"?token={secret}", json=body)).status_code == 400
            assert (await raw.post(url, json=body, headers={"Authorization": f"Bearer {secret}",
                                                           "Origin": "https://evil.example"})).status_code == 403
            assert (await raw.post(url, json=body, headers={"Authorization": f"Bearer {secret}"})).status_code == 200
            nb_answer = await raw.post(url, json=body, headers={"Authorization": f"Bearer {nb_secret}"})
            assert nb_answer.status_code == 403, nb_answer.text
            message = nb_answer.json()["error"]["message"]
            assert "mcp-token --client NAME" in message and "side panel" in message and "\n" not in message
            revoked = run_cli(tmp_path, "mcp-token", "--revoke", "all")
            assert revoked.returncode == 0, revoked.stderr
            assert (await raw.post(url, json=body, headers={"Authorization": f"Bearer {secret}"})).status_code == 401
    finally:
        daemon.stop()

    audit = _audit(daemon)
    calls = [r for r in audit if str(r.get("call_id") or "").startswith("mcpgw_")]
    assert any(r["tool"] == "t__echo" and r["origin"] == "daemon:agent" and r["decision"] == "allow" for r in calls), calls
    assert any(r["tool"] == "t__write_note" and r["decision"] == "deny" for r in calls)
    assert any(r["tool"] == "t__write_note" and r["decision"] == "allow" for r in calls)
    assert (daemon.data_dir / "logs" / "daemon.log").is_file()
    logs = "".join(p.read_text(errors="replace") for p in (daemon.data_dir / "logs").glob("*")) \
        + (tmp_path / "daemon.stderr").read_text(errors="replace") + json.dumps(audit)
    assert secret not in logs and secret[10:30] not in logs
