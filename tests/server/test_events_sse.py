"""GET relay/events: since validation, replay then live, heartbeat, pending permission re-send, slow subscriber."""

from __future__ import annotations

import asyncio

import pytest
from relay_http import request

from relay_jupyter.protocol.sse import parse_stream


@pytest.fixture
def jp_server_config(tmp_path):
    return {
        "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}},
        "RelayApp": {"data_dir": str(tmp_path / "relaydata"), "heartbeat_interval": 0.1, "sse_queue_size": 20},
    }


@pytest.fixture
def sse(jp_fetch, jp_http_port, jp_base_url, jp_serverapp):
    auth = {"Authorization": f"token {jp_serverapp.identity_provider.token}"}

    async def open_stream(query: str):
        reader, writer = await asyncio.open_connection("127.0.0.1", jp_http_port)
        writer.write(request("GET", f"{jp_base_url}relay/events{query}", headers=auth))
        head = await reader.readuntil(b"\r\n\r\n")
        return int(head.split()[1]), head, reader, writer

    return open_stream


async def read_frames(reader, want, timeout=5.0):
    buf, frames = "", []
    async with asyncio.timeout(timeout):
        while len(frames) < want:
            buf += (await reader.read(65536)).decode()
            got, buf = parse_stream(buf)
            frames += got
    return frames


@pytest.mark.parametrize("since", ["abc", "-1", "1e3", "99999999", "1" * 40, "%00"])
async def test_bad_since_is_400(sse, since):
    status, head, reader, writer = await sse(f"?since={since}")
    writer.close()
    assert status == 400


async def test_replay_then_live_with_heartbeat(sse, broker):
    for n in range(3):
        broker.events.append("test.event", {"n": n})
    status, head, reader, writer = await sse("?since=1")
    try:
        assert status == 200 and b"text/event-stream" in head
        frames = await read_frames(reader, 2)
        assert [f["id"] for f in frames] == ["2", "3"]
        broker.events.append("test.event", {"n": 99})
        live = await read_frames(reader, 1)
        assert live[0]["id"] == "4" and '"n":99' in live[0]["data"]
        async with asyncio.timeout(3):
            assert b": heartbeat" in await reader.readuntil(b": heartbeat")
    finally:
        writer.close()


async def test_no_since_is_live_only(sse, broker):
    broker.events.append("old", {})
    status, _, reader, writer = await sse("")
    try:
        await asyncio.sleep(0.05)
        broker.events.append("new", {})
        frames = await read_frames(reader, 1)
        assert [f["event"] for f in frames] == ["new"]
    finally:
        writer.close()


async def test_slow_subscriber_is_disconnected_and_memory_bounded(sse, broker):
    status, _, reader, writer = await sse("?since=0")
    assert status == 200
    async with asyncio.timeout(5):
        while broker.events.subscribers == 0:
            await asyncio.sleep(0.01)
    big = {"blob": "x" * 20_000}
    try:
        async with asyncio.timeout(20):
            for n in range(5000):  # ~100 MB if it were all buffered; the client never reads
                broker.events.append("flood", big)
                if n % 20 == 0:
                    await asyncio.sleep(0)
                    assert broker.events.max_lag() <= broker.config.sse_queue_size
                if broker.events.subscribers == 0:
                    break
        assert broker.events.subscribers == 0
        assert broker.events.disconnects.get("slow subscriber") == 1
    finally:
        writer.close()


async def test_reconnect_gets_pending_permission_requests_again(sse, broker):
    from relay_jupyter.core.types import ConsentRequest, ToolClass, ToolRequest, ToolSpec

    req = ToolRequest(origin="notebook:a.ipynb", tool=ToolSpec(name="run_code", tool_class=ToolClass.WRITE),
                      call_id="c1", run_id="r1", originator="kernel:k1")
    ask = asyncio.ensure_future(broker.permissions.ask(ConsentRequest(request_id="pr_p", request=req,
                                                                      deadline=1e12)))
    async with asyncio.timeout(5):
        while not broker.permissions._pending:
            await asyncio.sleep(0.01)
    for _ in range(3):
        broker.events.append("later", {})
    # reconnect after the request's id: the pending request comes first, then nothing older
    status, _, reader, writer = await sse(f"?since={broker.events.last_event_id()}")
    try:
        frames = await read_frames(reader, 1)
        assert frames[0]["event"] == "permission.request" and '"request_id":"pr_p"' in frames[0]["data"]
    finally:
        writer.close()
        ask.cancel()
