"""``jupyter relay tools list | pin | unpin`` end to end, against the test MCP server over stdio."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from relay_jupyter.cli import main
from relay_jupyter.storage.sqlite import Store


@pytest.fixture
def jupyter_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, notes: Path) -> Path:
    config = tmp_path / "config"
    config.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    (config / "mcp.json").write_text(json.dumps({"mcpServers": {
        "t": {"command": sys.executable, "args": ["-m", "relay_jupyter.testing.mcp_server", "--dir", str(notes)],
              "env": {"SECRET_TOKEN": "sk-do-not-print"}},
        "remote": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer sk-hidden"},
                   "disabled": True},
        "bad": {"url": "http://evil.com/mcp"},
    }}))
    return tmp_path


def _pins(root: Path) -> dict[str, str]:
    store = Store.open(root / "data" / "relay" / "relay.db")
    try:
        return {f'{p["server"]}__{p["tool"]}': str(p["tool_class"]) for p in store.list_pins()}
    finally:
        store.close()


def test_pin_list_unpin(jupyter_dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "pin", "t__echo", "read"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pinned t__echo as read; digest ")
    assert _pins(jupyter_dirs) == {"t__echo": "read"}

    assert main(["tools", "pin", "t__delete_note", "read"]) == 0
    assert "its annotations make it write" in capsys.readouterr().out

    assert main(["tools", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    classes = {t["name"]: (t["class"], t["pinned"]) for t in listing["tools"]}
    assert classes["t__echo"] == ("read", True)
    assert classes["t__add"] == ("write", False)
    assert classes["t__delete_note"] == ("write", True)
    states = {s["name"]: s["state"] for s in listing["servers"]}
    assert states == {"t": "connected", "remote": "disabled", "bad": "invalid"}

    assert main(["tools", "list"]) == 0
    text = capsys.readouterr().out
    assert "t__echo" in text and "(pinned)" in text and "loopback" in text
    assert "sk-do-not-print" not in text + json.dumps(listing) and "sk-hidden" not in text

    assert main(["tools", "unpin", "t__echo"]) == 0
    assert capsys.readouterr().out == "unpinned t__echo\n"
    assert main(["tools", "unpin", "t__echo"]) == 0
    assert "was not pinned" in capsys.readouterr().out
    assert _pins(jupyter_dirs) == {"t__delete_note": "read"}


def test_list_without_connecting_shows_pins(jupyter_dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store.open(jupyter_dirs / "data" / "relay" / "relay.db")
    store.put_pin("t", "echo", "f" * 64, "read")
    store.close()
    assert main(["tools", "list", "--no-connect"]) == 0
    out = capsys.readouterr().out
    assert "pin: t__echo -> read (digest ffffffffffff)" in out and "stopped" in out


def test_stale_pin_dropped_on_list(jupyter_dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store.open(jupyter_dirs / "data" / "relay" / "relay.db")
    store.put_pin("t", "echo", "0" * 64, "read")  # pinned when the tool looked different
    store.close()
    assert main(["tools", "list"]) == 0
    assert "pin dropped: t__echo changed" in capsys.readouterr().out
    assert _pins(jupyter_dirs) == {}


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["tools", "pin", "echo", "read"], "not an MCP tool name"),
        (["tools", "pin", "nosuch__echo", "read"], "no MCP server named 'nosuch'"),
        (["tools", "pin", "bad__echo", "read"], "not usable"),
        (["tools", "pin", "remote__echo", "read"], "disabled"),
        (["tools", "pin", "t__nope", "read"], "no connected MCP server offers"),
    ],
)
def test_user_mistakes_are_one_line(jupyter_dirs: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                    fragment: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and err.count("\n") == 1


def test_pin_class_choices(jupyter_dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # an argparse mistake is one line and exit 2 too (cli/app.py OneLineParser), not argparse's usage block
    assert main(["tools", "pin", "t__echo", "contained"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and err.count("\n") == 1 and err.startswith("jupyter relay: ")
