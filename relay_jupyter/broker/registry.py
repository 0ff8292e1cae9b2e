"""The RPC method table. Every broker method is registered here with strict models and its access rule.

A method lives in the module of its namespace (``broker/methods/<namespace>.py``), which declares its
access rule once and registers every handler through it::

    ACCESS = NOTEBOOK
    rpc = Namespace(ACCESS, "grants")

    @rpc.method(Method.GRANTS_LIST, OriginParams, GrantsListResult, doc="...", scope=Scope.ANY)
    async def grants_list(req: Request, params: OriginParams) -> GrantsListResult: ...

``broker/methods/__init__.py`` imports every namespace module by name (``tests/broker/test_methods_registry.py``
fails for a module that is not imported there, or a method outside its module's namespace). The server
layer parses the JSON-RPC envelope, validates ``params`` against the model (unknown fields rejected ->
-32602), calls the handler and serialises the result model (``broker/dispatch.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

__all__ = ["MethodSpec", "METHODS", "register"]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    params: type[BaseModel]
    result: type[BaseModel]
    handler: Callable[[Any, Any, Any], Awaitable[BaseModel]]
    doc: str
    access: Any = None
    """The namespace's access rule (``broker/methods/_access.Access``): every method has one
    (``tests/broker/test_methods_registry.py``); dispatch refuses to run a method without one."""
    scope: str = ""
    """``one`` | ``any`` | ``all``: the origin the method acts on (``_access.Scope``)."""
    namespace: str = ""


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` to the table.

    Raises:
        RuntimeError: the name is registered already.
    """
    if spec.name in METHODS:
        raise RuntimeError(f"RPC method {spec.name!r} registered twice")
    METHODS[spec.name] = spec
    return spec
