"""The elicitation card in the kernel, answering a real broker's question (widgets built outside a kernel:
ipywidgets uses a dummy comm there, and only the display calls are patched out)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from unittest.mock import patch

import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.elicitations import router_of
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.kernel.errors import RpcError
from relay_jupyter.kernel.widgets.elicitation_card import ElicitationCard, answer_elicitation, elicitation_text
from relay_jupyter.mcp.elicitation import ElicitationAsk, parse_form
from relay_jupyter.protocol.names import EventType

KERNEL = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb", client_id="kernel:aaa")
FORM = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "title": "<b>Name</b>"},
    "age": {"type": "integer", "default": 30, "minimum": 0},
    "colour": {"type": "string", "enum": ["red", "green"], "enumNames": ["Red", "Green"], "default": "green"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "default": ["b"]},
    "ok": {"type": "boolean", "default": True},
}}
HOSTILE = "Please <img src=x onerror=alert(1)> confirm\x1b[2J\u202e"


@dataclass(frozen=True)
class Ctx:
    origin: str = KERNEL.origin
    originator: str = KERNEL.client_id
    run_id: str = "run_1"


class KernelClient:
    """The kernel's side of the RPC, over the broker's real dispatch, raising the kernel's RpcError."""

    def __init__(self, broker: Broker, caller: Caller) -> None:
        self.broker, self.caller, self.sent = broker, caller, []

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        self.sent.append((method, params))
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        reply = json.loads(await self.broker.dispatch(self.caller, body))
        if "error" in reply:
            err = reply["error"]
            raise RpcError(err["code"], err["message"], err.get("data"), method)
        return reply["result"]


@pytest_asyncio.fixture
async def broker():
    b = Broker.open(BrokerConfig(in_memory=True, consent_timeout=30.0))
    yield b
    b.close()


async def ask(broker: Broker, message: str = HOSTILE) -> tuple[asyncio.Task[Any], dict[str, Any]]:
    text, fields = parse_form(message, FORM)
    task = asyncio.create_task(router_of(broker)(ElicitationAsk(server="srv<i>", message=text, fields=fields,
                                                                context=Ctx(), tool="srv__t")))
    for _ in range(500):
        found = [e for e in broker.store.events_since(0) if e.type == EventType.ELICITATION_REQUEST]
        if found:
            return task, found[0].data
        await asyncio.sleep(0.01)
    raise AssertionError("no request")


@pytest.mark.asyncio
async def test_the_card_is_built_from_the_form_escaped_and_marked_as_the_servers(broker: Broker) -> None:
    task, data = await ask(broker)
    card = ElicitationCard(data)
    html = "".join(getattr(child, "value", "") for child in card.widget.children if isinstance(
        getattr(child, "value", None), str))
    assert "srv&lt;i&gt;" in html and "not from relay" in html
    assert "<img" not in html and "&lt;img" in html
    assert set(card.inputs) == {"name", "age", "colour", "tags", "ok"}
    assert card.values() == {"age": 30, "colour": "green", "tags": ["b"], "ok": True}  # the server's defaults
    text = elicitation_text(data)
    assert "\x1b" not in text and "\u202e" not in text and "not relay's" in text
    router_of(broker).decline_all()
    await task


@pytest.mark.asyncio
async def test_submit_sends_the_values_and_a_refused_answer_reopens_the_card(broker: Broker) -> None:
    task, data = await ask(broker)
    client = KernelClient(broker, KERNEL)
    cards: list[ElicitationCard] = []
    with patch("relay_jupyter.kernel.widgets.elicitation_card.show"), \
            patch("relay_jupyter.kernel.widgets.elicitation_card.update"):
        running = asyncio.create_task(answer_elicitation(data, "widget", client, on_card=cards.append))
        while not cards:
            await asyncio.sleep(0.01)
        card = cards[0]
        card.buttons[0].click()  # Submit with the required name empty: the broker refuses, the card reopens
        while "required" not in card.status.value:
            await asyncio.sleep(0.01)
        assert not task.done()
        card.inputs["name"][1].value = "Ada"
        card.inputs["tags"][1].value = ("a", "c")
        card.buttons[0].click()
        assert await running == "accept"
    answer = await task
    assert (answer.action, answer.content) == ("accept", {"name": "Ada", "age": 30, "colour": "green",
                                                          "tags": ["a", "c"], "ok": True})
    assert [p["action"] for _m, p in client.sent] == ["accept", "accept"]
    assert all(b.disabled for b in card.buttons) and "Submitted by you" in card.status.value


@pytest.mark.asyncio
@pytest.mark.parametrize("surface", ["headless", "input"])
async def test_a_kernel_without_a_form_declines(broker: Broker, surface: str, capsys: pytest.CaptureFixture[str]
                                                ) -> None:
    task, data = await ask(broker)
    assert await answer_elicitation(data, surface, KernelClient(broker, KERNEL)) == "decline"
    assert (await task).action == "decline"
    assert "declined" in capsys.readouterr().out


@pytest.mark.asyncio
async def test_an_unanswered_card_declines(broker: Broker) -> None:
    task, data = await ask(broker)
    with patch("relay_jupyter.kernel.widgets.elicitation_card.show"), \
            patch("relay_jupyter.kernel.widgets.elicitation_card.update"):
        assert await answer_elicitation(data, "widget", KernelClient(broker, KERNEL), timeout=0.2) == "decline"
    assert (await task).action == "decline"
