"""Elicitation end to end in a real kernel: %%agent → the model calls an MCP tool → the server asks → the card
in the cell → typed and submitted as a browser would (comm messages) → the server gets the answer.

A real Jupyter server with the relay extension, its broker and runtime, the fake Anthropic server as the
model, and a real stdio MCP server (``elicit_server.py``, MCP SDK 2.3) configured in mcp.json.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the kernel tests' rig, as pytest names it
from kernel.conftest import execute, text_of  # noqa: E402
from kernel.real_server import RealServer  # noqa: E402

pytestmark = pytest.mark.slow
MODEL = "claude-fake-1"
SERVER = Path(__file__).with_name("elicit_server.py")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic, Any]]:
    with FakeAnthropic(api_key="test-key") as fake:
        tmp = tmp_path_factory.mktemp("elicit")
        mcp_json = tmp / "mcp.json"
        mcp_json.write_text(json.dumps({"mcpServers": {"el": {"command": sys.executable, "args": [str(SERVER)]}}}))
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "default_model": MODEL,
                  "mcp_config_path": str(mcp_json)}
        with RealServer(tmp, config) as srv:
            kc = srv.kernel_for("elicit.ipynb")
            assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
            yield srv, fake, kc


class Browser:
    """Answers the cards of one cell as a person in JupyterLab would: Connect, then type into the form's
    name box and press the given button of the question card."""

    def __init__(self, kc: Any, button: str, name: str | None = None) -> None:
        self.kc, self.button, self.name = kc, button, name
        self.name_box: str | None = None
        self.pressed: list[str] = []

    def send(self, comm_id: str, data: dict[str, Any]) -> None:
        self.kc.shell_channel.send(self.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data}))

    def __call__(self, msg: dict[str, Any]) -> None:
        if msg["msg_type"] != "comm_open":
            return
        state = msg["content"]["data"].get("state", {})
        comm_id = msg["content"]["comm_id"]
        if state.get("_model_name") == "TextModel" and str(state.get("description", "")).startswith("Name"):
            self.name_box = comm_id
        if state.get("_model_name") != "ButtonModel":
            return
        label = state.get("description")
        if label == "Connect" or (label == self.button and self.button not in self.pressed):
            if label == self.button and self.name is not None and self.name_box is not None:
                self.send(self.name_box, {"method": "update", "state": {"value": self.name}, "buffer_paths": []})
            self.pressed.append(label)
            self.send(comm_id, {"method": "custom", "content": {"event": "click"}})


def _wait_connected(srv: RealServer) -> None:
    for _ in range(300):
        status = srv.api("POST", "relay/rpc", {"jsonrpc": "2.0", "id": 1, "method": "tools.list", "params": {}})
        if any(t.get("name") == "el__ask_name" for t in (status.get("result") or {}).get("tools", [])):
            return
        time.sleep(0.1)


def test_the_question_is_a_card_in_the_cell_and_the_typed_name_reaches_the_server(
        stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, kc = stack
    _wait_connected(srv)
    fake.enqueue(Reply(tool_use("el__ask_name", {})), Reply(text("Thanks.")))
    browser = Browser(kc, "Submit", name="Ada Lovelace")
    reply, msgs = execute(kc, f"%%agent --mode full --model {MODEL}\nwho am I?", on_iopub=browser, timeout=120)
    shown = text_of(msgs)
    assert reply["status"] == "ok", shown
    assert "Submit" in browser.pressed, shown
    assert "the MCP server el asks" in shown and "not relay's" in shown and "Who are you?" in shown
    assert "Thanks." in shown
    assert "accepted: Ada Lovelace (30)" in json.dumps(fake.requests[-1].body["messages"])


def test_decline_reaches_the_server_as_decline(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, kc = stack
    fake.enqueue(Reply(tool_use("el__ask_name", {})), Reply(text("Fine.")))
    browser = Browser(kc, "Decline")
    reply, msgs = execute(kc, f"%%agent --mode full --model {MODEL}\nwho am I?", on_iopub=browser, timeout=120)
    assert reply["status"] == "ok", text_of(msgs)
    assert browser.pressed[-1] == "Decline"
    assert "answer: decline" in json.dumps(fake.requests[-1].body["messages"])


def test_a_headless_kernel_declines_without_a_card(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    _srv, fake, kc = stack
    fake.enqueue(Reply(tool_use("el__ask_name", {})), Reply(text("Ok.")))
    reply, msgs = execute(kc, f"%%agent --mode full --model {MODEL}\nwho am I?", allow_stdin=False, timeout=120)
    shown = text_of(msgs)
    assert reply["status"] == "ok", shown
    assert "declined a question from the MCP server el" in shown
    assert not [m for m in msgs if m["msg_type"] == "comm_open"
                and m["content"]["data"].get("state", {}).get("description") == "Submit"]
    assert "answer: decline" in json.dumps(fake.requests[-1].body["messages"])
