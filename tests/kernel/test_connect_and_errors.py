"""Connect card on first use, --bg, and one-line errors when the broker is unreachable."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import execute, start_kernel, text_of
from .fake_broker import FakeBroker


@pytest.fixture
def fresh(tmp_path: Any) -> Iterator[tuple[Any, FakeBroker]]:
    with FakeBroker(grant=False) as fake:
        km, kc = start_kernel(fake.env(), str(tmp_path))
        execute(kc, "%load_ext relay_jupyter")
        try:
            yield kc, fake
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_connect_card_creates_the_grant(fresh: tuple[Any, FakeBroker]) -> None:
    kc, fake = fresh
    clicked: list[str] = []

    def observe(msg: dict[str, Any]) -> None:
        state = msg["content"].get("data", {}).get("state", {}) if msg["msg_type"] == "comm_open" else {}
        if state.get("_model_name") == "ButtonModel" and state.get("description") == "Connect" and not clicked:
            clicked.append(msg["content"]["comm_id"])
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": msg["content"]["comm_id"], "data": {
                "method": "custom", "content": {"event": "click"}}}))

    fake.script([("text", "connected")])
    reply, msgs = execute(kc, "%%agent --model claude-x\nhello", on_iopub=observe)
    assert reply["status"] == "ok", text_of(msgs)
    (create,) = [p for m, p in fake.calls if m == "grants.create"]
    assert create["models"] == ["claude-x"] and "write_file" in create["tools"]
    assert create["budget"]["tokens_per_day"] == 200_000
    # the second cell does not ask again (the load-time pre-warm and the first cell each asked once:
    # a pre-warm that found no grant does not spare the first cell its own check)
    asked = [m for m, _ in fake.calls].count("grants.get")
    assert asked in (1, 2)
    fake.script([("text", "again")])
    execute(kc, "%%agent\nhello again")
    assert [m for m, _ in fake.calls].count("grants.get") == asked


def test_headless_without_grant_fails_with_one_line(fresh: tuple[Any, FakeBroker]) -> None:
    kc, fake = fresh
    reply, msgs = execute(kc, "%%agent\nhello", allow_stdin=False)
    assert reply["status"] == "error"
    (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(tb) == 1 and "no relay grant" in tb[0]
    assert not [m for m, _ in fake.calls if m == "run.start"]


def test_background_run_returns_at_once_and_keeps_writing(fresh: tuple[Any, FakeBroker]) -> None:
    kc, fake = fresh
    fake.has_grant = True
    fake.script([("sleep", 0.5), ("text", "late words")])
    seen: list[dict[str, Any]] = []
    reply, msgs = execute(kc, "%%agent --bg\nslow", on_iopub=seen.append)
    assert reply["status"] == "ok"
    assert "late words" not in text_of(msgs)
    cell_id = msgs[0]["parent_header"]["msg_id"]
    execute(kc, "import asyncio\nawait asyncio.sleep(1.0)", on_iopub=seen.append)
    later = [m for m in seen if m["parent_header"].get("msg_id") == cell_id]
    assert "late words" in text_of(later)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_broker_gives_one_line(tmp_path: Any) -> None:
    env = {"RELAY_URL": f"http://127.0.0.1:{_closed_port()}/relay/", "RELAY_KERNEL_CREDENTIAL": "x"}
    km, kc = start_kernel(env, str(tmp_path))
    try:
        execute(kc, "%load_ext relay_jupyter")
        reply, msgs = execute(kc, "%%agent\nhello")
        assert reply["status"] == "error"
        (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
        assert len(tb) == 1 and "unreachable" in tb[0] and "x" not in tb[0].split("unreachable")[1][:5]
        # the credential never appears in what the user sees
        assert "RelayKernel" not in text_of(msgs)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_wrong_credential_gives_one_line(tmp_path: Any) -> None:
    with FakeBroker() as fake:
        km, kc = start_kernel({"RELAY_URL": fake.url, "RELAY_KERNEL_CREDENTIAL": "wrong"}, str(tmp_path))
        try:
            execute(kc, "%load_ext relay_jupyter")
            reply, msgs = execute(kc, "%%agent\nhello")
            assert reply["status"] == "error"
            (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
            assert len(tb) == 1 and "HTTP 401" in tb[0] and "wrong" not in tb[0]
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
