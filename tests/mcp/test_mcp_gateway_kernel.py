"""Kernel tools of a named notebook through the gated MCP gateway (issue 20 Deliver 6): an outside MCP client
(the official ``mcp`` SDK client) with a ``jupyter relay mcp-token --notebook`` token reaches the variables and
DataFrames of that notebook's real kernel — only while that kernel is attached (``%load_ext relay_jupyter``),
through the same grant, with ``run_code`` waiting for the side panel's answer, every call audited.

A real Jupyter server (pytest-jupyter) with real kernels; nothing mocked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from relay_jupyter.broker.mcp_gateway import mint_token, tokens_file
from relay_jupyter.core.types import Grant
from relay_jupyter.server.mcp_gateway import gateway_url
from jupyter_kernels import KernelRig, in_kernel

pytestmark = pytest.mark.slow

ORIGIN = "notebook:gwk.ipynb"
KERNEL_TOOLS = {"list_variables", "describe_dataframe", "run_code"}


@pytest.fixture
def jp_server_config(tmp_path):
    return {
        "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}},
        "RelayApp": {"data_dir": str(tmp_path / "relaydata"), "consent_timeout": 60.0},
    }


async def _until(check: Any, what: str, bound: float = 60.0) -> Any:
    """Poll ``check()`` until it is truthy (a bound, not a timed assertion: the test fails only if it never is)."""
    async with asyncio.timeout(bound):
        while not (found := await check()):
            await asyncio.sleep(0.1)
    assert found, what
    return found


async def test_an_outside_client_reaches_the_attached_kernel_of_its_notebook_only(
        jp_fetch, jp_serverapp, jp_http_port, jp_base_url, tmp_path: Path) -> None:
    broker = jp_serverapp.extension_manager.extension_points["relay_jupyter"].app.broker
    rig = KernelRig(jp_fetch, jp_serverapp)
    broker.grants.issue(Grant(origin=ORIGIN, tools=frozenset(KERNEL_TOOLS | {"propose_cell"}),
                              models=frozenset({"*"}), consent_id="c"))
    token = mint_token(tokens_file(tmp_path / "relaydata"), ORIGIN, label="outside")
    url = gateway_url(f"http://127.0.0.1:{jp_http_port}{jp_base_url}")

    def client() -> Client:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=90)
        return Client(streamable_http_client(url, http_client=http))

    async def names() -> set[str]:
        async with client() as c:
            return {t.name for t in (await c.list_tools()).tools}

    setup = "%load_ext relay_jupyter\nimport pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': list('xyz')})\nsecret_x = 41\n"
    # another notebook's attached kernel, holding a variable of its own: never offered to gwk's token
    other = await rig.session("other.ipynb")
    await in_kernel(jp_serverapp, other, setup.replace("secret_x = 41", "other_only = 7"))
    await _until(lambda: _attached(broker, "notebook:other.ipynb"), "other.ipynb's kernel never attached")
    assert await names() == set()  # gwk's kernel is not attached: its grant names only kernel tools
    async with client() as c:
        absent = await c.call_tool("list_variables", {})
        assert absent.is_error and "UNKNOWN_TOOL" in absent.content[0].text

    kernel = await rig.session("gwk.ipynb")
    await in_kernel(jp_serverapp, kernel, setup)
    await _until(lambda: _attached(broker, ORIGIN), "gwk.ipynb's kernel never attached")
    # propose_cell acts on a running cell's reply: an outside client has none, so it is not offered
    assert await names() == KERNEL_TOOLS
    async with client() as c:
        listed = await c.call_tool("list_variables", {})
        assert not listed.is_error, listed.content
        text = listed.content[0].text
        assert "df" in text and "secret_x" in text and "other_only" not in text
        described = await c.call_tool("describe_dataframe", {"name": "df"})
        assert not described.is_error and "shape=(3, 2)" in described.content[0].text
        refused = await c.call_tool("propose_cell", {"code": "1"})
        assert refused.is_error and "UNKNOWN_TOOL" in refused.content[0].text

        # run_code is a write: it waits for the side panel (the browser session of the server's user)
        for decision, expect in (("deny", "41"), ("allow", "42")):
            pending = asyncio.ensure_future(c.call_tool("run_code", {"code": "secret_x = 42\nprint('ran')"}))
            card = await _until(lambda: _pending(rig), "no permission request for run_code")
            assert card["tool"] == "run_code" and card.get("originator") is None and "secret_x = 42" in json.dumps(card)
            # the kernel that will run the code cannot approve it itself (the side panel's card, not its own)
            cred = await rig.credential(kernel)
            own = await rig.rpc("permission.answer", {"request_id": card["request_id"], "decision": "allow"}, cred)
            assert "error" in own, own
            answered = await rig.rpc("permission.answer", {"request_id": card["request_id"], "decision": decision})
            assert "error" not in answered, answered
            result = await pending
            if decision == "deny":
                assert result.is_error and "CONSENT_DENIED" in result.content[0].text
            else:
                assert not result.is_error and "ran" in result.content[0].text, result.content
            assert (await in_kernel(jp_serverapp, kernel, "print(secret_x)")).strip() == expect

    audit = [json.loads(line) for line in (tmp_path / "relaydata" / "audit.jsonl").read_text().splitlines() if line]
    calls = [r for r in audit if str(r.get("call_id") or "").startswith("mcpgw_") and r.get("origin") == ORIGIN]
    assert {r["tool"] for r in calls} >= KERNEL_TOOLS
    assert any(r["tool"] == "run_code" and r["decision"] == "deny" for r in calls)
    assert token not in json.dumps(audit) and token not in json.dumps([e.data for e in broker.store.events_since(0)])

    # the kernel gone: its tools are gone with it, and a call names why
    await jp_fetch("api", "kernels", kernel, method="DELETE")
    await _until(lambda: _detached(broker, ORIGIN), "gwk.ipynb's kernel still attached after its shutdown")
    assert await names() == set()


async def _attached(broker: Any, origin: str) -> bool:
    return bool(broker.events.kernel_clients(origin))


async def _detached(broker: Any, origin: str) -> bool:
    return not broker.events.kernel_clients(origin)


async def _pending(rig: KernelRig) -> dict[str, Any] | None:
    requests = (await rig.rpc("permission.pending", {}))["result"]["requests"]
    return requests[0] if requests else None
