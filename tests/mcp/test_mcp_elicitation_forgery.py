"""Attack: answer an MCP server's question (elicitation) meant for another notebook's kernel.

A real Jupyter server (pytest-jupyter) with real kernels of two notebooks, the fake Anthropic server as the model
and a real stdio MCP server (``raw_mcp_server.py``, protocol 2025-06-18) whose ``ask`` tool asks the user for a
name. Notebook A's run calls it (``full`` mode: no permission card, the question is still asked); the question
waits for A's card. Then, through the public RPC only, with real kernel credentials:

- notebook B's kernel, holding A's question id (as if it leaked), lists the pending questions, answers it
  (accept with its own value, decline, cancel) — and a forged id;
- A's own kernel answers a value the form does not take (the question stays open).

Held: B sees nothing and none of its answers lands (``NOT_ORIGINATOR`` / ``NOT_FOUND``); the server receives
exactly A's answer, once (its log of what the client sent), and the audit's one ``elicitation:raw__ask`` record
is answered by A's kernel, with the field names and never the value. The check can fail: A's answer does reach
the server.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from jupyter_kernels import KernelRig

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
MALLORY = "Mallory-forged-3c1d"
ADA = "Ada-answered-9e2b"


@pytest.fixture
def model_fake():
    with FakeAnthropic(api_key="test-key") as fake:
        yield fake


@pytest.fixture
def server_log(tmp_path: Path) -> Path:
    return tmp_path / "raw.log"


@pytest.fixture
def jp_server_config(tmp_path, model_fake, server_log):
    spec = tmp_path / "elicit.json"
    spec.write_text(json.dumps({"message": "Your name?", "requestedSchema": {
        "type": "object", "properties": {"name": {"type": "string", "title": "Name"}}, "required": ["name"]}}))
    mcp_json = tmp_path / "mcp.json"
    mcp_json.write_text(json.dumps({"mcpServers": {"raw": {"command": sys.executable, "args": [
        str(HERE / "raw_mcp_server.py"), "--version", "2025-06-18", "--elicit", str(spec), "--log", str(server_log)]}}}))
    return {
        "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}},
        "RelayApp": {"data_dir": str(tmp_path / "relaydata"), "heartbeat_interval": 0.2, "consent_timeout": 120.0,
                     "anthropic_base_url": model_fake.base_url, "anthropic_api_key": "test-key",
                     "default_model": "claude-test-1", "mcp_config_path": str(mcp_json)},
    }


def _sent_answers(log: Path) -> list[dict[str, Any]]:
    """What the client answered to the server's elicitation/create requests (the server's log)."""
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [m for m in lines if "method" not in m and "result" in m and "action" in (m.get("result") or {})]


async def test_only_the_asking_notebooks_kernel_answers_a_servers_question(
        jp_fetch, jp_serverapp, model_fake, server_log) -> None:
    app = jp_serverapp.extension_manager.extension_points["relay_jupyter"].app
    if getattr(app, "_mcp_start", None) is None:  # pytest-jupyter does not run the started-server hook itself
        await app._start_jupyter_server_extension(jp_serverapp)

    rig = KernelRig(jp_fetch, jp_serverapp)
    rpc, session, credential = rig.rpc, rig.session, rig.credential

    def code(answer: dict[str, Any]) -> str:
        assert "error" in answer, answer
        return answer["error"].get("data", {}).get("code") or str(answer["error"]["code"])

    ka = await session("a.ipynb")
    kb = await session("b.ipynb")
    try:
        cred_a, cred_b = await credential(ka), await credential(kb)
        for cred in (cred_a, cred_b):
            assert "result" in await rpc("grants.create", {"tools": ["raw__ask"], "models": ["claude-test-1"]}, cred)
        model_fake.enqueue(Reply(tool_use("raw__ask", {})))
        model_fake.enqueue(Reply(text("thanks")))
        run_id = (await rpc("run.start", {"conversation": "c1", "prompt": "ask me", "mode": "full"}, cred_a)
                  )["result"]["run_id"]
        async with asyncio.timeout(60):
            while not (pending := (await rpc("elicitation.pending", {}, cred_a))["result"]["requests"]):
                await asyncio.sleep(0.05)
        [question] = pending
        request_id = question["request_id"]
        assert question["run_id"] == run_id and question["server"] == "raw"

        # notebook B holds A's question id: it sees nothing and none of its answers lands
        assert (await rpc("elicitation.pending", {}, cred_b))["result"]["requests"] == []
        for action, content in (("accept", {"name": MALLORY}), ("decline", None), ("cancel", None)):
            params = {"request_id": request_id, "action": action, **({"content": content} if content else {})}
            assert code(await rpc("elicitation.answer", params, cred_b)) in ("NOT_ORIGINATOR", "NOT_FOUND")
        # a forged id, from either kernel
        for cred in (cred_a, cred_b):
            assert code(await rpc("elicitation.answer", {"request_id": "elic_" + "0" * 24, "action": "accept",
                                                          "content": {"name": MALLORY}}, cred)) in (
                "NOT_FOUND", "-32602")
        # A's own kernel answering a field the form does not have: refused, the question stays open
        assert code(await rpc("elicitation.answer", {"request_id": request_id, "action": "accept",
                                                      "content": {"password": MALLORY}}, cred_a)) == "INVALID_ARGUMENTS"
        assert [q["request_id"] for q in (await rpc("elicitation.pending", {}, cred_a))["result"]["requests"]] == [
            request_id]
        assert _sent_answers(server_log) == []  # nothing reached the server yet

        # the check can fail: A's answer reaches the server, exactly once
        ok = (await rpc("elicitation.answer", {"request_id": request_id, "action": "accept",
                                               "content": {"name": ADA}}, cred_a))["result"]
        assert ok["action"] == "accept"
        async with asyncio.timeout(60):
            while (await rpc("runs.get", {"run_id": run_id}, cred_a))["result"]["run"]["state"] in (
                    "running", "pending", "waiting"):
                await asyncio.sleep(0.05)
        # a replay after the answer, by B and by A: nothing more reaches the server
        for cred in (cred_b, cred_a):
            assert code(await rpc("elicitation.answer", {"request_id": request_id, "action": "accept",
                                                          "content": {"name": MALLORY}}, cred)) in (
                "NOT_ORIGINATOR", "NOT_FOUND", "CONFLICT")
        sent = _sent_answers(server_log)
        assert [m["result"] for m in sent] == [{"action": "accept", "content": {"name": ADA}}], sent
        assert MALLORY not in server_log.read_text()

        records = [r for r in (await rpc("audit.tail", {"n": 1000}, cred_a))["result"]["records"]
                   if r["tool"] == "elicitation:raw__ask"]
        assert [(r["decision"], r["answered_by"]) for r in records] == [("accept", ok["answered_by"])], records
        assert ADA not in json.dumps(records) and MALLORY not in json.dumps(records)
        # and B's kernel cannot read A's record either
        assert [r for r in (await rpc("audit.tail", {"n": 1000}, cred_b))["result"]["records"]
                if r["tool"] == "elicitation:raw__ask"] == []
    finally:
        for kernel_id in (ka, kb):
            await jp_serverapp.kernel_manager.shutdown_kernel(kernel_id, now=True)
