"""The RPC method table. Every broker method registers itself here with strict models.

A method module (``broker/control.py``, ``broker/runs.py``, ``broker/workspace_methods.py``, ...)
declares::

    @method("grants.list", GrantsListParams, GrantsListResult, doc="...")
    async def grants_list(broker, caller, params): ...

The server layer parses the JSON-RPC envelope, validates ``params`` against the model
(unknown fields rejected -> -32602), calls the handler and serialises the result model.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

__all__ = ["MethodSpec", "METHODS", "method"]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    params: type[BaseModel]
    result: type[BaseModel]
    handler: Callable[[Any, Any, Any], Awaitable[BaseModel]]
    doc: str


METHODS: dict[str, MethodSpec] = {}


def method(name: str, params: type[BaseModel], result: type[BaseModel], *, doc: str = ""):
    """Register ``handler(broker, caller, params) -> result`` under ``name``."""

    def decorate(handler: Callable[[Any, Any, Any], Awaitable[BaseModel]]):
        if name in METHODS:
            raise RuntimeError(f"RPC method {name!r} registered twice")
        METHODS[name] = MethodSpec(name, params, result, handler, doc or (handler.__doc__ or "").strip())
        return handler

    return decorate
