"""Dispatch a JSON-RPC body to the registered methods (``broker.registry.METHODS``).

Transport-neutral: the Jupyter handler and the standalone daemon both call :func:`dispatch` with
the raw body and the :class:`~relay_jupyter.core.caller.Caller` they authenticated. Errors:

- transport problems use the JSON-RPC codes (-32700, -32600, -32601, -32602), ``id: null``
  when the id is unknown;
- a policy refusal is -32000 with the stable code in ``error.data.code``;
- anything unexpected is -32603 "Internal error" with no detail (it is logged, without params).

A batch runs its requests concurrently (a call waiting for consent must not hold up the others);
responses come back in request order; notifications never get a response.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..core.caller import Caller
from ..core.errors import InvalidParams, MethodNotFound, ProtocolError, Refusal
from ..protocol import jsonrpc
from .registry import METHODS

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["call_method", "dispatch"]

log = logging.getLogger("relay_jupyter.broker")


def _validation_details(exc: ValidationError) -> list[dict[str, Any]]:
    # Only where and what: never the offending input, which may hold a secret.
    return [{"loc": [str(p) for p in err["loc"]], "msg": err["msg"], "type": err["type"]}
            for err in exc.errors(include_url=False, include_input=False)[:20]]


async def call_method(broker: Broker, caller: Caller, method: str, params: dict[str, Any] | None) -> Any:
    """Validate ``params`` against the method's model, call it, and return the JSON-ready result.

    Raises:
        ProtocolError: MethodNotFound / InvalidParams; Refusal from the method itself.
    """
    spec = METHODS.get(method)
    if spec is None or spec.access is None:  # a method without its namespace's access rule never runs
        raise MethodNotFound("Method not found")
    try:
        model = spec.params.model_validate(params or {})
    except ValidationError as exc:
        raise InvalidParams("Invalid params", data={"errors": _validation_details(exc)}) from None
    result = await spec.handler(broker, caller, model)
    if not isinstance(result, spec.result):
        raise TypeError(f"{method} returned {type(result).__name__}, not {spec.result.__name__}")
    return result.model_dump(mode="json", by_alias=True)


async def _one(broker: Broker, caller: Caller, item: jsonrpc.RpcRequest | jsonrpc.RpcFailure
               ) -> dict[str, Any] | None:
    if isinstance(item, jsonrpc.RpcFailure):
        broker.metrics.rpc("_invalid", "invalid_request")
        return item.response
    try:
        result = await call_method(broker, caller, item.method, item.params)
    except Refusal as exc:
        broker.metrics.rpc(item.method, exc.code.value)
        response = jsonrpc.failure(item.id, exc.rpc_code, exc.message, exc.to_error_data())
    except ProtocolError as exc:
        broker.metrics.rpc(item.method, str(exc.rpc_code))
        response = jsonrpc.failure(item.id, exc.rpc_code, exc.message, exc.data or None)
    except asyncio.CancelledError:
        raise
    except Exception:
        broker.metrics.rpc(item.method, "internal")
        log.exception("relay RPC method %s failed", item.method if item.method in METHODS else "?")
        response = jsonrpc.failure(item.id, jsonrpc.INTERNAL_ERROR, "Internal error")
    else:
        broker.metrics.rpc(item.method, "ok")
        response = jsonrpc.success(item.id, result)
    return None if item.notification else response


async def dispatch(broker: Broker, caller: Caller, body: bytes) -> bytes | None:
    """Answer one HTTP body of JSON-RPC. Returns the response bytes, or None (only notifications)."""
    parsed = jsonrpc.parse_body(body)
    if parsed.error is not None:
        broker.metrics.rpc("_invalid", "parse_error" if parsed.error["error"]["code"] == -32700
                           else "invalid_request")
        return jsonrpc.encode(parsed.error)
    if not parsed.batch:
        response = await _one(broker, caller, parsed.items[0])
        return None if response is None else jsonrpc.encode(response)
    responses = await asyncio.gather(*(_one(broker, caller, item) for item in parsed.items))
    kept = [r for r in responses if r is not None]
    return jsonrpc.encode(kept) if kept else None

