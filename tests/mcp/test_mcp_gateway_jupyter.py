"""``{base_url}relay/mcp`` in a real Jupyter server (pytest-jupyter): the official ``mcp`` SDK client with a
gateway token lists and calls the origin's granted tools; the Jupyter token or a cookie never opens it."""

from __future__ import annotations

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from relay_jupyter.broker.mcp_gateway import mcp_gateway_of
from relay_jupyter.core.types import Grant
from relay_jupyter.server.mcp_gateway import gateway_url

ORIGIN = "notebook:gw.ipynb"


@pytest.fixture
def jp_server_config(tmp_path):
    return {
        "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}},
        "RelayApp": {"data_dir": str(tmp_path / "relaydata"), "consent_timeout": 5.0},
    }


async def test_the_jupyter_mount_serves_the_gateway_to_an_sdk_client(jp_fetch, jp_serverapp, jp_http_port, jp_base_url) -> None:
    broker = jp_serverapp.extension_manager.extension_points["relay_jupyter"].app.broker
    broker.grants.issue(Grant(origin=ORIGIN, tools=frozenset({"scratch_list"}), models=frozenset({"*"}),
                              consent_id="c"))
    url = gateway_url(f"http://127.0.0.1:{jp_http_port}{jp_base_url}")
    session = await mcp_gateway_of(broker).session(ORIGIN, url=url, conversation="c1")
    assert session.url.endswith("/relay/mcp")
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {session.token}"}, timeout=20)
    async with Client(streamable_http_client(session.url, http_client=http)) as client:
        tools = (await client.list_tools()).tools
        assert [t.name for t in tools] == ["scratch_list"]
        listed = await client.call_tool("scratch_list", {})
        assert not listed.is_error, listed.content
        refused = await client.call_tool("scratch_write", {"path": "a.txt", "content": "x"})
        assert refused.is_error and refused.content[0].text.startswith("refused (")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    jupyter_token = jp_serverapp.identity_provider.token
    async with httpx2.AsyncClient(timeout=10) as raw:
        for headers in ({"Authorization": f"token {jupyter_token}"}, {"Authorization": f"Bearer {jupyter_token}"},
                        {}):
            assert (await raw.post(session.url, json=body, headers=headers)).status_code == 401
        assert (await raw.post(session.url + f"?token={jupyter_token}", json=body)).status_code == 400
    mcp_gateway_of(broker).end(session)
