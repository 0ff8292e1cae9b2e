"""Strict JSON-RPC parsing: every hostile body gets the documented transport error, never an exception."""

from __future__ import annotations

import json

import pytest

from relay_jupyter.protocol import jsonrpc


def only_error(body):
    parsed = jsonrpc.parse_body(body)
    assert parsed.error is not None
    return parsed.error


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}', "duplicate key"),
        (b'{"jsonrpc":"2.0","id":1,"method":"a","params":{"x":NaN}}', "NaN"),
        (b'{"jsonrpc":"2.0","id":1,"method":"a","params":{"x":-Infinity}}', "Infinity"),
        (b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}', "UTF-8"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b"[" * 100 + b"]" * 100, "nesting"),
        (b"[" * 200_000, "nesting"),
        (b'{"jsonrpc":"2.0","id":1,"method":"a","params":{"s":"\\ud800"}}', "surrogate"),
        (b"", "Expecting value"),
        (b"{", "line 1"),
    ],
)
def test_parse_errors(body, fragment):
    err = only_error(body)
    assert err["id"] is None
    assert err["error"]["code"] == -32700
    assert fragment in err["error"]["message"]


def test_depth_at_limit_is_fine():
    body = '{"jsonrpc":"2.0","id":1,"method":"a","params":{"x":' + "[" * 60 + "]" * 60 + "}}"
    parsed = jsonrpc.parse_body(body.encode())
    assert parsed.error is None and isinstance(parsed.items[0], jsonrpc.RpcRequest)


@pytest.mark.parametrize(
    "obj, code, reply_id",
    [
        ([], -32600, None),
        (5, -32600, None),
        ({"jsonrpc": "1.0", "id": 3, "method": "a"}, -32600, 3),
        ({"jsonrpc": "2.0", "id": True, "method": "a"}, -32600, None),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "a"}, -32600, None),
        ({"jsonrpc": "2.0", "id": {"x": 1}, "method": "a"}, -32600, None),
        ({"jsonrpc": "2.0", "id": 4, "method": 7}, -32600, 4),
        ({"jsonrpc": "2.0", "id": 5, "method": "a", "extra": 1}, -32600, 5),
        ({"jsonrpc": "2.0", "id": 6, "method": "a", "params": [1, 2]}, -32602, 6),
    ],
)
def test_invalid_requests(obj, code, reply_id):
    parsed = jsonrpc.parse_body(json.dumps(obj).encode())
    response = parsed.error or parsed.items[0].response
    assert response["error"]["code"] == code
    assert response["id"] == reply_id


def test_notification_and_batch_shapes():
    parsed = jsonrpc.parse_body(b'[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","id":"x","method":"b","params":{}}]')
    assert parsed.batch and parsed.error is None
    first, second = parsed.items
    assert first.notification and first.id is None
    assert not second.notification and second.id == "x" and second.params == {}


def test_batch_too_large():
    body = json.dumps([{"jsonrpc": "2.0", "id": i, "method": "a"} for i in range(jsonrpc.MAX_BATCH + 1)])
    assert only_error(body.encode())["error"]["code"] == -32600


def test_encode_refuses_nan():
    with pytest.raises(ValueError):
        jsonrpc.encode({"x": float("nan")})
