"""mcp.json parsing: Claude Desktop format, one bad entry disables only itself, clear messages."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from relay_jupyter.mcp.config import (
    MAX_CONFIG_BYTES,
    HttpServerConfig,
    StdioServerConfig,
    default_config_path,
    load_config,
    parse_config,
)


def _cfg(servers: dict) -> str:
    return json.dumps({"mcpServers": servers})


def test_claude_desktop_format() -> None:
    cfg = parse_config(
        _cfg(
            {
                "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
                "remote": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer T0KEN"}},
                "local": {"type": "http", "url": "http://127.0.0.1:3001/mcp"},
                "off": {"command": "x", "disabled": True},
            }
        )
    )
    assert cfg.problems == {}
    assert list(cfg.servers) == ["time", "remote", "local"]
    time_cfg = cfg.servers["time"]
    assert isinstance(time_cfg, StdioServerConfig)
    assert time_cfg.source == "uvx mcp-server-time"
    assert isinstance(cfg.servers["remote"], HttpServerConfig)
    assert cfg.servers["remote"].source == "https://mcp.example.com/mcp"
    assert cfg.disabled == ("off",)
    # Secrets never show in repr/str.
    assert "T0KEN" not in repr(cfg.servers["remote"]) and "T0KEN" not in str(cfg)
    assert "UTC" not in repr(time_cfg)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"url": "http://evil.com/mcp"}, "loopback"),
        ({"url": "https://u:p@example.com/mcp"}, "credentials"),
        ({"url": "https://example.com/mcp?token=x"}, "query"),
        ({"command": "x", "url": "https://example.com"}, "not both"),
        ({}, "needs 'command'"),
        ({"args": ["x"]}, "needs 'command'"),
        ({"command": ""}, "command"),
        ({"command": "x", "args": "not-a-list"}, "args"),
        ({"command": "x", "env": {"BAD-NAME": "v"}}, "environment variable name"),
        ({"command": "x", "comand": "typo"}, "comand"),
        ({"command": "x", "timeout": -1}, "timeout"),
        ({"command": "x", "timeout": 10_000}, "timeout"),
        ({"type": "sse", "url": "https://example.com/sse"}, "SSE"),
        ({"type": "websocket", "url": "https://example.com"}, "unknown transport"),
        ({"type": "stdio", "url": "https://example.com"}, "does not match"),
        ({"command": "x", "disabled": "yes"}, "disabled"),
        ({"command": "a\u0000b"}, "NUL"),
        ({"url": "https://example.com", "headers": {"Host": "x"}}, "managed"),
        ("just a string", "must be an object"),
    ],
)
def test_bad_entry_disables_only_itself(entry: object, fragment: str) -> None:
    cfg = parse_config(_cfg({"bad": entry, "good": {"command": "ok"}}))
    assert list(cfg.servers) == ["good"]
    assert fragment in cfg.problems["bad"], cfg.problems


def test_server_names() -> None:
    cfg = parse_config(
        _cfg(
            {
                "a__b": {"command": "x"},
                "has space": {"command": "x"},
                "": {"command": "x"},
                "x" * 40: {"command": "x"},
                "Git": {"command": "x"},
                "git": {"command": "y"},
                "ok-name_1": {"command": "x"},
            }
        )
    )
    assert set(cfg.servers) == {"Git", "ok-name_1"}
    assert "'__'" in cfg.problems["a__b"]
    assert "clashes" in cfg.problems["git"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"mcpServers": []}', "must be an object"),
        ('{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}', "appears twice"),
        ("[" * 100_000, "not valid JSON"),
        (b"\xff\xfe garbage", "not valid JSON"),
    ],
)
def test_bad_file(text: str | bytes, fragment: str) -> None:
    cfg = parse_config(text)
    assert cfg.servers == {}
    assert fragment in cfg.problems[""]


def test_unknown_top_level_keys_are_noted_not_fatal() -> None:
    cfg = parse_config(json.dumps({"globalShortcut": "x", "mcpServers": {"a": {"command": "x"}}}))
    assert list(cfg.servers) == ["a"] and "globalShortcut" in cfg.problems[""]


def test_load_from_jupyter_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    assert default_config_path() == tmp_path / "mcp.json"
    assert load_config().servers == {}  # missing file: empty, no problem
    (tmp_path / "mcp.json").write_text(_cfg({"t": {"command": "x"}}))
    assert list(load_config().servers) == ["t"]


def test_load_refuses_oversized_fifo_and_dirs(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_CONFIG_BYTES + 10))
    assert "larger than" in load_config(big).problems[""]
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert "not a regular file" in load_config(fifo).problems[""]  # and it does not hang
    assert "not a regular file" in load_config(tmp_path).problems[""]
