"""The fixtures reach this module through the pytest11 entry point alone (no conftest imports them)."""

from __future__ import annotations

import os
import stat

import anthropic
import httpx2
import mcp
import pytest

from relay_jupyter.testing import Reply, tool_use
from relay_jupyter.testing.pytest_plugin import FAKE_API_KEY


def test_plugin_is_registered_by_entry_point(request):
    plugin = request.config.pluginmanager.get_plugin("relay_jupyter")
    assert plugin is not None and plugin.__name__ == "relay_jupyter.testing.pytest_plugin"


def test_fake_anthropic_fixture_sync_client(fake_anthropic):
    fake_anthropic.enqueue(Reply(tool_use("echo", {"text": "x"})))
    client = anthropic.Anthropic(api_key=fake_anthropic.api_key, base_url=fake_anthropic.base_url,
                                 max_retries=0)
    with client:
        msg = client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].input == {"text": "x"}
    assert fake_anthropic.api_key == FAKE_API_KEY and fake_anthropic.saw_api_key(FAKE_API_KEY)


def test_fake_openai_fixture(fake_openai):
    fake_openai.enqueue("hello")
    r = httpx2.post(f"{fake_openai.base_url}/chat/completions",
                    headers={"authorization": f"Bearer {fake_openai.api_key}"},
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.json()["choices"][0]["message"]["content"] == "hello"


@pytest.mark.asyncio
async def test_mcp_http_server_fixture(mcp_http_server):
    async with mcp.Client(mcp_http_server.url) as c:
        result = await c.call_tool("write_note", {"path": "n.txt", "text": "hi"})
    assert not result.is_error
    assert (mcp_http_server.directory / "n.txt").read_text() == "hi"


def test_relay_data_dir(relay_data_dir, tmp_path):
    assert os.environ["JUPYTER_DATA_DIR"] == str(tmp_path / "jupyter-data")
    assert relay_data_dir == tmp_path / "jupyter-data" / "relay" and relay_data_dir.is_dir()
    assert stat.S_IMODE(relay_data_dir.stat().st_mode) == 0o700
