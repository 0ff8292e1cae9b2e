"""POST relay/rpc over a real socket: hostile bodies get JSON-RPC errors and the connection stays usable;
an oversized body gets 413 before it is read whole; notifications get no response."""

from __future__ import annotations

import asyncio
import json

import pytest
from relay_http import read_response, request


@pytest.fixture
def conn_info(jp_fetch, jp_http_port, jp_base_url, jp_serverapp):
    return jp_http_port, jp_base_url, {"Authorization": f"token {jp_serverapp.identity_provider.token}"}


HOSTILE = [
    (b'{"jsonrpc":"2.0","id":1,"method":"grants.list","method":"kill"}', -32700),
    (b'{"jsonrpc":"2.0","id":1,"method":"grants.list","params":{"n":NaN}}', -32700),
    (b'{"jsonrpc":"2.0","id":1,"method":"grants.list","params":' + b"[" * 5000 + b"]" * 5000 + b"}", -32700),
    (b'{"jsonrpc":"2.0","id":1,"method":"\xc3\x28"}', -32700),
    (b'{"jsonrpc":"2.0","id":1,"method":"no.such.method"}', -32601),
    (b'{"jsonrpc":"2.0","id":1,"method":"grants.list","params":{"bogus":true}}', -32602),
    (b'{"jsonrpc":"2.0","id":1}', -32600),
    (b"[]", -32600),
    (b"not json", -32700),
]


async def test_hostile_bodies_keep_the_connection_usable(conn_info):
    port, base, auth = conn_info
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        good = b'{"jsonrpc":"2.0","id":7,"method":"grants.list"}'
        for body, code in HOSTILE:
            writer.write(request("POST", f"{base}relay/rpc", headers=auth, body=body))
            status, _, raw = await read_response(reader)
            assert status == 200
            reply = json.loads(raw)
            assert reply["error"]["code"] == code, body[:60]
            if code == -32700 or body == b"[]":
                assert reply["id"] is None  # the id is unknown
            elif body != b"[]":
                assert reply["id"] == 1
            # the same connection answers a good request right after
            writer.write(request("POST", f"{base}relay/rpc", headers=auth, body=good))
            status, _, raw = await read_response(reader)
            assert json.loads(raw) == {"jsonrpc": "2.0", "id": 7, "result": {"grants": []}}
    finally:
        writer.close()


async def test_notifications_and_batches(conn_info):
    port, base, auth = conn_info
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request("POST", f"{base}relay/rpc", headers=auth,
                             body=b'{"jsonrpc":"2.0","method":"grants.list"}'))
        status, _, raw = await read_response(reader)
        assert status == 204 and raw == b""
        batch = json.dumps([
            {"jsonrpc": "2.0", "id": 1, "method": "grants.list"},
            {"jsonrpc": "2.0", "method": "grants.list"},
            {"jsonrpc": "2.0", "id": 2, "method": "nope"},
            5,
        ]).encode()
        writer.write(request("POST", f"{base}relay/rpc", headers=auth, body=batch))
        status, _, raw = await read_response(reader)
        replies = json.loads(raw)
        assert [r["id"] for r in replies] == [1, 2, None]
        assert "result" in replies[0] and replies[1]["error"]["code"] == -32601
        assert replies[2]["error"]["code"] == -32600
    finally:
        writer.close()


async def test_oversized_body_is_413_before_reading_it(conn_info, broker):
    port, base, auth = conn_info
    limit = broker.config.max_body_bytes
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        # announce a huge body and send none of it: the answer must come without the body
        head = request("POST", f"{base}relay/rpc", headers={**auth, "Content-Length": str(limit + 1)})
        head = head.replace(b"Content-Length: 0\r\n", b"")
        writer.write(head)
        async with asyncio.timeout(10):
            status, _, _ = await read_response(reader)
        assert status == 413
    finally:
        writer.close()


async def test_oversized_chunked_body_is_413(conn_info, broker):
    port, base, auth = conn_info
    limit = broker.config.max_body_bytes
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request("POST", f"{base}relay/rpc", headers={**auth, "Transfer-Encoding": "chunked"}))
        chunk = b"x" * 65536
        for _ in range(limit // len(chunk) + 2):
            writer.write(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(10):
            status, _, _ = await read_response(reader)
        assert status == 413
    finally:
        writer.close()
    # and the server still serves
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request("POST", f"{base}relay/rpc", headers=auth,
                         body=b'{"jsonrpc":"2.0","id":1,"method":"grants.list"}'))
    status, _, _ = await read_response(reader)
    writer.close()
    assert status == 200
