"""JSON-RPC 2.0 envelopes: strict parsing of a request body and building of responses.

Transport-neutral (no tornado): the server layer hands in the raw body bytes and gets back
parsed requests or a ready error response. Strictness beyond the JSON spec, on purpose:

- invalid UTF-8, a BOM, ``NaN``/``Infinity``, duplicate object keys, lone surrogates and nesting
  deeper than :data:`MAX_DEPTH` are parse errors (-32700): each is a classic way to make two
  parsers disagree about what a request says;
- a request object with unknown members, a non-string method, a float or boolean id, or
  positional (array) params is invalid (-32600 / -32602).

The stdlib ``json`` module is used with hooks rather than a third-party parser because the hooks
cover every rule above and ``json`` is already the fastest parser installed here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_BATCH",
    "MAX_DEPTH",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "RpcFailure",
    "RpcRequest",
    "encode",
    "failure",
    "loads_strict",
    "parse_body",
    "success",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

#: Deepest nesting of arrays/objects accepted in a body.
MAX_DEPTH = 64
#: Most requests accepted in one batch.
MAX_BATCH = 100

_ALLOWED_MEMBERS = frozenset({"jsonrpc", "method", "params", "id"})
_NO_ID = object()


class _StrictJSONError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _StrictJSONError(f"duplicate key {key[:40]!r}")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise _StrictJSONError(f"{name} is not valid JSON")


def _check_tree(value: Any) -> None:
    """Iterative walk: depth limit and strings that encode as UTF-8 (no lone surrogates)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise _StrictJSONError("string contains a lone surrogate") from None
        elif isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise _StrictJSONError(f"nesting deeper than {MAX_DEPTH}")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in items:
                if isinstance(key, str):
                    stack.append((key, depth))
                if isinstance(child, str | dict | list):
                    stack.append((child, depth + 1))


def loads_strict(body: bytes | str) -> Any:
    """Parse ``body`` as strict JSON (rules in the module docstring).

    Raises:
        ValueError: with a short message safe to show the caller (it never echoes the body).
    """
    if isinstance(body, bytes | bytearray | memoryview):
        try:
            text = bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"body is not valid UTF-8 (byte {exc.start})") from None
    else:
        text = body
    if text.startswith("\ufeff"):
        raise ValueError("body starts with a byte order mark")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
        _check_tree(value)
    except RecursionError:
        raise ValueError(f"nesting deeper than {MAX_DEPTH}") from None
    except _StrictJSONError as exc:
        raise ValueError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return value


@dataclass(frozen=True)
class RpcRequest:
    """One well-formed request of a body. ``id`` is absent for a notification."""

    method: str
    params: Any
    """The raw ``params`` member: a dict, or ``None`` when absent (never a list: refused earlier)."""
    id: Any = None
    notification: bool = False


@dataclass(frozen=True)
class RpcFailure:
    """A request of a body that could not be dispatched; ``response`` is the error to send (or None
    when it was a notification, which never gets a response)."""

    response: dict[str, Any] | None


@dataclass
class ParsedBody:
    """What :func:`parse_body` found: ``items`` in order, and whether the body was a batch."""

    items: list[RpcRequest | RpcFailure] = field(default_factory=list)
    batch: bool = False
    error: dict[str, Any] | None = None
    """Set when the whole body is unusable (parse error, empty batch): the one response to send."""


def _valid_id(value: Any) -> bool:
    # bool is an int subclass; floats are allowed by the spec only as "SHOULD NOT": refuse both.
    return value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _parse_one(obj: Any) -> RpcRequest | RpcFailure:
    if not isinstance(obj, dict):
        return RpcFailure(failure(None, INVALID_REQUEST, "Invalid Request: not an object"))
    raw_id = obj.get("id", _NO_ID)
    id_ok = raw_id is _NO_ID or _valid_id(raw_id)
    reply_id = raw_id if (raw_id is not _NO_ID and id_ok) else None
    if not id_ok:
        return RpcFailure(failure(None, INVALID_REQUEST, "Invalid Request: id must be a string, integer or null"))
    if obj.get("jsonrpc") != "2.0":
        return RpcFailure(failure(reply_id, INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"'))
    unknown = set(obj) - _ALLOWED_MEMBERS
    if unknown:
        names = ", ".join(sorted(k[:40] for k in unknown)[:5])
        return RpcFailure(failure(reply_id, INVALID_REQUEST, f"Invalid Request: unknown members: {names}"))
    method = obj.get("method")
    if not isinstance(method, str) or not method:
        return RpcFailure(failure(reply_id, INVALID_REQUEST, 'Invalid Request: "method" must be a string'))
    notification = raw_id is _NO_ID
    params = obj.get("params")
    if "params" in obj and not isinstance(params, dict):
        # Every relay method takes named params; positional arrays are refused outright.
        response = None if notification else failure(reply_id, INVALID_PARAMS, "Invalid params: must be an object")
        return RpcFailure(response)
    return RpcRequest(method=method, params=params, id=None if notification else raw_id, notification=notification)


def parse_body(body: bytes | str) -> ParsedBody:
    """Parse a whole JSON-RPC body: one request or a batch. Never raises."""
    try:
        value = loads_strict(body)
    except ValueError as exc:
        return ParsedBody(error=failure(None, PARSE_ERROR, f"Parse error: {exc}"))
    if isinstance(value, list):
        if not value:
            return ParsedBody(batch=True, error=failure(None, INVALID_REQUEST, "Invalid Request: empty batch"))
        if len(value) > MAX_BATCH:
            return ParsedBody(
                batch=True,
                error=failure(None, INVALID_REQUEST, f"Invalid Request: batch larger than {MAX_BATCH}"),
            )
        return ParsedBody(items=[_parse_one(item) for item in value], batch=True)
    return ParsedBody(items=[_parse_one(value)])


def success(request_id: Any, result: Any) -> dict[str, Any]:
    """A success response object."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def failure(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """An error response object; ``data`` is omitted when None."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def encode(payload: Any) -> bytes:
    """Serialise a response (or batch of responses) compactly as UTF-8."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
