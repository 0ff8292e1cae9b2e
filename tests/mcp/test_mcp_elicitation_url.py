"""URL-mode elicitation (MCP 2025-11-25 ``elicitation/create`` with ``mode: "url"``): a server asks the user to
open a page (a sign-in, a payment). relay checks the link, shows it with its host on a card in the originating
notebook, never opens it itself, and answers accept only when the person says they opened it.

Real parts: ``raw_mcp_server.py`` (stdio, answering the handshake with 2025-11-25 or 2025-06-18 and sending the
URL request verbatim), relay's ``McpConnection`` and the broker's ``ElicitationRouter``; the card built with real
ipywidgets outside a kernel (display calls patched out, as in ``test_mcp_elicitation_card.py``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.elicitations import ElicitationRouter
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import RoutingRefusal
from relay_jupyter.mcp.config import StdioServerConfig
from relay_jupyter.mcp.connection import McpConnection
from relay_jupyter.mcp.elicitation import Refused, call_context, parse_url_request
from relay_jupyter.protocol.names import EventType

HERE = Path(__file__).parent
ORIGIN = "notebook:u.ipynb"
KERNEL = Caller(kind=CallerKind.KERNEL, origin=ORIGIN, client_id="kernel:u")
STATE = "state-9d2f1c"
PAGE = f"https://pay.example.com/checkout?session={STATE}"


@dataclass(frozen=True)
class Ctx:
    origin: str = ORIGIN
    originator: str = "kernel:u"
    run_id: str = "run_u"


@pytest_asyncio.fixture
async def broker():
    b = Broker.open(BrokerConfig(in_memory=True, consent_timeout=30.0))
    yield b
    b.close()


def _server(tmp_path: Path, version: str, url: str, message: str = "Finish the payment on the shop's page") -> Any:
    spec = tmp_path / "elicit.json"
    spec.write_text(json.dumps({"mode": "url", "message": message, "url": url, "elicitationId": "el-1"}))
    return StdioServerConfig(name="shop", command=sys.executable,
                             args=[str(HERE / "raw_mcp_server.py"), "--version", version, "--elicit", str(spec)])


def _events(broker: Broker, kind: str) -> list[Any]:
    return [e for e in broker.store.events_since(0) if e.type == kind]


async def _request(broker: Broker) -> dict[str, Any]:
    for _ in range(1500):
        found = _events(broker, EventType.ELICITATION_REQUEST)
        if found:
            return found[0].data
        await asyncio.sleep(0.01)
    raise AssertionError("no elicitation.request")


def test_the_link_is_checked() -> None:
    assert parse_url_request("Pay", PAGE) == ("Pay", PAGE, "pay.example.com")
    assert parse_url_request("Local", "http://127.0.0.1:8080/x")[2] == "127.0.0.1"
    assert parse_url_request("IDN", "https://pаypal.com/")[2] == "xn--pypal-4ve.com"  # a Cyrillic а, shown as it is
    for bad in ("http://pay.example.com/", "javascript:alert(1)", "https://user:pw@pay.example.com/",
                "https://pay.example.com/a b", "https://pay.example.com/\x1b[2J", "https:///nohost", "",
                "https://pay.example.com/\u202egnp.exe", "https://x.example/" + "a" * 3000, None, "file:///etc/passwd"):
        with pytest.raises(Refused) as info:
            parse_url_request("x", bad)
        assert info.value.kind == "url"
    with pytest.raises(Refused):
        parse_url_request("   ", PAGE)  # no message saying what the page is for


@pytest.mark.asyncio
async def test_a_url_request_is_a_card_for_the_originating_notebook_and_accept_means_opened(
        broker: Broker, tmp_path: Path) -> None:
    router = ElicitationRouter(broker.events, audit=broker.audit, timeout=30.0)
    conn = McpConnection(_server(tmp_path, "2025-11-25", PAGE), connect_timeout=15.0, call_timeout=10.0)
    conn.elicitation_handler = router
    try:
        await conn.open()
        with call_context(Ctx()):
            call = asyncio.create_task(conn.call_tool("ask", {}))
            request = await _request(broker)
        assert request["mode"] == "url" and request["url"] == PAGE and request["url_host"] == "pay.example.com"
        assert request["fields"] == [] and request["from"] == "server" and request["originator"] == "kernel:u"
        other = Caller(kind=CallerKind.KERNEL, origin="notebook:other.ipynb", client_id="kernel:o")
        with pytest.raises(RoutingRefusal) as info:
            router.answer(other, request["request_id"], "accept")
        assert info.value.code.value == "NOT_ORIGINATOR"
        with pytest.raises(RoutingRefusal) as info:  # nothing typed goes back through relay in URL mode
            router.answer(KERNEL, request["request_id"], "accept", {"card": "4111"})
        assert info.value.code.value == "INVALID_ARGUMENTS"
        router.answer(KERNEL, request["request_id"], "accept")
        result = await call
    finally:
        await conn.close()
    assert json.loads(result["content"]) == [{"action": "accept"}]  # no content: only "I opened it"
    audit = [r for r in broker.audit.tail(20) if r.tool.startswith("elicitation:")]
    assert [(r.decision, r.arguments.get("mode"), r.arguments.get("url_host")) for r in audit] == [
        ("accept", "url", "pay.example.com")]
    assert STATE not in json.dumps([r.model_dump() for r in broker.audit.tail(50)], default=str)  # the host only


@pytest.mark.asyncio
@pytest.mark.parametrize(("version", "url", "expect"), [
    ("2025-06-18", PAGE, "error"),  # URL mode is not part of 2025-06-18: the server gets an error, no card
    ("2025-11-25", "http://pay.example.com/checkout", "declined"),  # not https: declined unseen, one line
    ("2025-11-25", "https://me:pw@pay.example.com/", "declined"),
])
async def test_a_url_request_relay_will_not_show_never_becomes_a_card(broker: Broker, tmp_path: Path, version: str,
                                                                      url: str, expect: str) -> None:
    router = ElicitationRouter(broker.events, audit=broker.audit, timeout=30.0)
    conn = McpConnection(_server(tmp_path, version, url), connect_timeout=15.0, call_timeout=10.0)
    conn.elicitation_handler = router
    try:
        await conn.open()
        with call_context(Ctx()):
            result = await conn.call_tool("ask", {})
    finally:
        await conn.close()
    replies = json.loads(result["content"])
    assert _events(broker, EventType.ELICITATION_REQUEST) == []
    if expect == "error":
        assert "error" in replies[0] and "URL elicitation is not part of protocol 2025-06-18" in json.dumps(replies)
    else:
        assert replies == [{"action": "decline"}]
        resolved = _events(broker, EventType.ELICITATION_RESOLVED)
        assert len(resolved) == 1 and resolved[0].data["refused_kind"] == "url" and resolved[0].data["refused"]


@pytest.mark.asyncio
async def test_the_card_shows_the_host_and_the_link_and_opens_nothing() -> None:
    pytest.importorskip("ipywidgets")
    from relay_jupyter.kernel.widgets.elicitation_card import ElicitationCard, elicitation_text

    data = {"request_id": "el_1", "server": "shop<b>", "tool": "shop__ask", "mode": "url", "url": PAGE,
            "url_host": "pay.example.com", "message": "Finish <img src=x onerror=alert(1)> paying", "fields": []}
    with patch("relay_jupyter.kernel.widgets.elicitation_card.show"):
        card = ElicitationCard(data)
        card.show()
    markup = card.widget.children[0].value
    assert "<b>pay.example.com</b>" in markup and f'href="{PAGE}"' in markup.replace("&amp;", "&")
    assert 'rel="noopener noreferrer"' in markup and "<img" not in markup and "&lt;img" in markup and "shop&lt;b&gt;" in markup
    assert "relay does not open it" in markup
    assert [b.description for b in card.buttons] == ["I opened it", "Decline", "Cancel"]
    assert card.inputs == {}  # no form: nothing typed here goes anywhere
    card.buttons[0].click()
    assert await card.wait(1.0) == ("accept", {})
    assert "open a page on pay.example.com (relay does not open it)" in elicitation_text(data)
    hostile = ElicitationCard({**data, "url": "javascript:alert(1)"})  # never from the broker; still inert
    assert "javascript:" not in hostile.widget.children[0].value.split("<a", 1)[-1].split(">", 1)[0]
