"""Every RPC method of the broker, one module per namespace (docs/architecture.md, "a new RPC method").

Each module declares its access rule once (``ACCESS``, from :mod:`._access`) and registers its handlers
through one :class:`~._access.Namespace` (``rpc``), which applies the rule before a handler runs.
The modules are imported here by name: importing this package registers every method, and
``tests/broker/test_methods_registry.py`` fails for a module of this package missing from
:data:`MODULES`, for a method registered outside it, and for a method in ``docs/protocol.md``
without a handler (or the reverse).
"""

from __future__ import annotations

from types import ModuleType

from . import (
    audit,
    budget,
    checkpoints,
    conversations,
    elicitation,
    grants,
    kernel,
    mcp,
    permissions,
    runs,
    telemetry,
    tools,
    trust,
    workspace,
)

__all__ = ["MODULES"]

#: The namespace modules, each with ``ACCESS`` and ``rpc``.
MODULES: tuple[ModuleType, ...] = (grants, budget, audit, runs, conversations, permissions, kernel, trust, checkpoints,
                                   workspace, elicitation, tools, telemetry, mcp)
