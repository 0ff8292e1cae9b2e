"""Protocol versions: every version the official SDKs still speak works for tools, each with its own features.

Two kinds of server:
- real servers built on old MCP SDKs, each in its own venv (``tests/mcp/make_old_sdk_venvs.sh``):
  mcp 1.9 (protocol 2025-03-26) and mcp 1.12 (protocol 2025-06-18) — marked ``peer``;
- ``raw_mcp_server.py``, written against the protocol text, which answers the handshake with whatever
  version the test says (a lying server included).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from relay_jupyter.cli import main
from relay_jupyter.mcp import McpRegistry
from relay_jupyter.mcp.config import McpConfig, StdioServerConfig
from relay_jupyter.mcp.connection import McpConnection, McpToolError
from relay_jupyter.mcp.elicitation import ElicitationAnswer, call_context
from relay_jupyter.mcp.versions import SUPPORTED_PROTOCOL_VERSIONS, version_note

from mcp_support import old_sdk_python, old_server

HERE = Path(__file__).parent


def raw_server(name: str, version: str, *extra: str) -> StdioServerConfig:
    return StdioServerConfig(name=name, command=sys.executable,
                             args=[str(HERE / "raw_mcp_server.py"), "--version", version, *extra])


def test_the_four_versions_are_supported() -> None:
    assert SUPPORTED_PROTOCOL_VERSIONS == ("2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28")
    assert version_note("2025-03-26") and version_note("2025-06-18")
    assert version_note("2025-11-25") is None and version_note("2026-07-28") is None


@pytest.mark.peer
@pytest.mark.parametrize(("line", "version", "structured"), [("1.9", "2025-03-26", False), ("1.12", "2025-06-18", True)])
async def test_a_server_on_an_old_sdk_works_for_tools(line: str, version: str, structured: bool) -> None:
    config = McpConfig(servers={"old": old_server("old", line)})
    async with McpRegistry(config, connect_timeout=30.0) as registry:
        status = registry.status()[0]
        assert (status.state, status.protocol_version) == ("connected", version), status.error
        names = {s.name for s in registry.specs()}
        assert {"old__echo", "old__ask_name"} <= names
        result = await registry.call("old__echo", {"text": "hi"})
        assert result["content"] == "echo: hi" and not result["is_error"]
        assert (result["structured"] is not None) is structured  # 2025-03-26 has no structured results
        # annotations exist from 2025-03-26 on; they only ever tighten, and the tool stays write unpinned
        assert registry.spec("old__echo").hints.get("read_only_hint") is True
        assert registry.spec("old__echo").tool_class.value == "write"


@pytest.mark.peer
def test_tools_list_names_an_older_version_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config"
    config.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    (config / "mcp.json").write_text(json.dumps({"mcpServers": {
        "old": {"command": old_sdk_python("1.9"), "args": [str(HERE / "old_sdk_server.py")]},
        "mid": {"command": old_sdk_python("1.12"), "args": [str(HERE / "old_sdk_server.py")]},
        "new": {"command": sys.executable, "args": ["-m", "relay_jupyter.testing.mcp_server", "--dir", str(tmp_path)]},
    }}))
    assert main(["tools", "list", "--timeout", "30"]) == 0
    text = capsys.readouterr().out
    notes = [line.strip() for line in text.splitlines() if line.strip().startswith("note:")]
    assert notes == ["note: older protocol 2025-03-26: tools work; no structured results and no elicitation",
                     "note: older protocol 2025-06-18: tools and form elicitation work; no URL elicitation"], text
    assert "old__echo" in text and "mid__echo" in text and "new__echo" in text
    assert main(["tools", "list", "--json", "--timeout", "30"]) == 0
    servers = {s["name"]: s for s in json.loads(capsys.readouterr().out)["servers"]}
    assert servers["old"]["protocol_note"].startswith("older protocol 2025-03-26")
    assert servers["new"]["protocol_note"] is None and servers["new"]["protocol_version"] == "2026-07-28"


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
async def test_each_handshake_version_is_accepted(version: str) -> None:
    conn = McpConnection(raw_server("raw", version), connect_timeout=15.0)
    try:
        await conn.open()
        assert conn.protocol_version == version
        assert (await conn.call_tool("echo", {"text": "x"}))["content"] == "x"
    finally:
        await conn.close()


@pytest.mark.parametrize(("version", "expected"), [
    ("2024-11-05", "speaks protocol '2024-11-05'; relay supports 2025-03-26, 2025-06-18, 2025-11-25, 2026-07-28"),
    ("1999-01-01", "speaks protocol '1999-01-01'; relay supports"),
    ("v9\u202e\x1b[31m", "speaks protocol 'v9"),
    # a modern version cannot be reached through initialize: a server claiming it there lies
    ("2026-07-28", "answered the initialize handshake with protocol 2026-07-28"),
])
async def test_a_version_relay_does_not_speak_is_refused_by_name(version: str, expected: str) -> None:
    conn = McpConnection(raw_server("liar", version), connect_timeout=15.0)
    with pytest.raises(McpToolError) as info:
        await conn.open()
    assert info.value.reason == "version"
    assert expected in info.value.message
    assert "\x1b" not in info.value.message and "\u202e" not in info.value.message
    assert not conn.connected


async def test_a_2025_03_26_server_gets_only_what_its_version_has(tmp_path: Path) -> None:
    """A server that negotiated 2025-03-26 but sends structured content and elicitation requests (both
    2025-06-18 features): the structured content is dropped, the elicitation never reaches the user."""
    log = tmp_path / "received.jsonl"
    conn = McpConnection(raw_server("old", "2025-03-26", "--structured", "--log", str(log)), connect_timeout=15.0)
    asked: list[object] = []

    async def handler(ask: object) -> ElicitationAnswer:
        asked.append(ask)
        return ElicitationAnswer("accept", {"name": "should never be sent"})

    conn.elicitation_handler = handler
    try:
        await conn.open()
        echoed = await conn.call_tool("echo", {"text": "hi"})
        assert echoed["structured"] is None and echoed["content"] == "hi"
        with call_context(object()):
            replies = json.loads((await conn.call_tool("ask", {}))["content"])
    finally:
        await conn.close()
    assert asked == []
    assert replies[0]["error"]["code"] == -32601  # method not found: not part of 2025-03-26
    assert "should never be sent" not in log.read_text()
    # the client's initialize offered the handshake's newest version, and the server's answer stood
    first = json.loads(next(line for line in log.read_text().splitlines() if '"initialize"' in line))
    assert first["params"]["protocolVersion"] == "2025-11-25"
