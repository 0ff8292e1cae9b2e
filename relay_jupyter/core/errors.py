"""The one error tree of relay-jupyter, and the stable refusal codes.

Tool failures are *results* (a tool that ran and failed returns ``is_error``);
protocol and policy failures are *exceptions* from this tree::

    RelayError                      every error the broker raises on purpose
    ├── ProtocolError               malformed request; JSON-RPC transport codes
    │   ├── ParseError              -32700
    │   ├── InvalidRequest          -32600
    │   ├── MethodNotFound          -32601
    │   └── InvalidParams           -32602
    └── Refusal                     a policy decision; JSON-RPC -32000, ``error.data.code`` below
        ├── GateRefusal             UNAUTHORIZED, SCOPE_EXCEEDED, BUDGET_EXCEEDED,
        │                           CONSENT_DENIED, PERMISSION_TIMEOUT
        ├── RoutingRefusal          NOT_ORIGINATOR, NOT_FOUND, CONFLICT
        ├── WorkspaceRefusal        PATH_REFUSED, QUOTA_EXCEEDED, EDIT_NO_MATCH,
        │                           EDIT_AMBIGUOUS, NOT_TEXT, DIGEST_MISMATCH
        └── ConfigRefusal           NO_BACKEND, NO_CREDENTIALS, MODEL_NOT_ALLOWED, ...

Every refusal carries ``code`` (a stable string from :class:`Code`, safe to match on),
a human ``message`` (one line a notebook user can act on), and optional ``data``
(JSON-serialisable, never a secret).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = [
    "Code",
    "RelayError",
    "ProtocolError",
    "ParseError",
    "InvalidRequest",
    "MethodNotFound",
    "InvalidParams",
    "Refusal",
    "GateRefusal",
    "RoutingRefusal",
    "WorkspaceRefusal",
    "ConfigRefusal",
    "REFUSAL_RPC_CODE",
]

#: JSON-RPC error code used for every policy refusal; the stable code is in ``error.data.code``.
REFUSAL_RPC_CODE = -32000


class Code(StrEnum):
    """Stable refusal codes. Clients match on these; never rename one."""

    # the gate, in the order of docs/gate.md §1
    UNAUTHORIZED = "UNAUTHORIZED"
    SCOPE_EXCEEDED = "SCOPE_EXCEEDED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    CONSENT_DENIED = "CONSENT_DENIED"
    PERMISSION_TIMEOUT = "PERMISSION_TIMEOUT"
    # routing
    NOT_ORIGINATOR = "NOT_ORIGINATOR"
    NOT_FOUND = "NOT_FOUND"
    CONFLICT = "CONFLICT"
    WIDENING_REFUSED = "WIDENING_REFUSED"
    # workspace
    DIGEST_MISMATCH = "DIGEST_MISMATCH"
    PATH_REFUSED = "PATH_REFUSED"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    EDIT_NO_MATCH = "EDIT_NO_MATCH"
    EDIT_AMBIGUOUS = "EDIT_AMBIGUOUS"
    NOT_TEXT = "NOT_TEXT"
    # validation of a tool call before the gate
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    ARGUMENTS_TOO_LARGE = "ARGUMENTS_TOO_LARGE"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    # configuration
    NO_BACKEND = "NO_BACKEND"
    NO_ENGINE = "NO_ENGINE"
    """The run's engine cannot run here (its optional extra, its CLI or the scratch workspace is missing)."""
    NO_CREDENTIALS = "NO_CREDENTIALS"
    MODEL_NOT_ALLOWED = "MODEL_NOT_ALLOWED"
    BACKEND_ERROR = "BACKEND_ERROR"
    """The model server answered wrongly: an HTTP error, an error event, malformed JSON/SSE, or a stream
    that ended before its end marker (the server's own error type and message, secrets redacted)."""
    BACKEND_UNREACHABLE = "BACKEND_UNREACHABLE"
    """The model server could not be reached, or the connection was cut mid-answer."""
    BACKEND_TIMEOUT = "BACKEND_TIMEOUT"
    """A model turn hit its deadline (``turn_timeout`` overall, or ``turn_idle_timeout`` with no content)."""
    ENDPOINT_REFUSED = "ENDPOINT_REFUSED"
    """An MCP/HTTP endpoint broke the endpoint policy (not https/loopback, credentials in the URL)."""
    CONFIG_INVALID = "CONFIG_INVALID"
    """A configuration file (e.g. mcp.json) or one of its entries is malformed."""
    TOOL_ERROR = "TOOL_ERROR"
    CANCELLED = "CANCELLED"
    INTERRUPTED = "INTERRUPTED"
    """A run ended ``run.interrupted``: the broker restarted while it ran (re-run the cell)."""
    UNAVAILABLE = "UNAVAILABLE"
    """A broker component (runtime, MCP, workspace) is not configured in this server."""
    STORAGE_FULL = "STORAGE_FULL"
    """The disk holding the relay data directory is full: the broker cannot record (or audit) anything."""
    STORAGE_ERROR = "STORAGE_ERROR"
    """The relay database could not be written (I/O error, read-only, locked): nothing new is accepted."""
    INTERNAL = "INTERNAL"


class RelayError(Exception):
    """Base of every error relay-jupyter raises on purpose."""

    def __init__(self, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = dict(data or {})


class ProtocolError(RelayError):
    """A malformed request. ``rpc_code`` is the JSON-RPC transport code."""

    rpc_code = -32600


class ParseError(ProtocolError):
    rpc_code = -32700


class InvalidRequest(ProtocolError):
    rpc_code = -32600


class MethodNotFound(ProtocolError):
    rpc_code = -32601


class InvalidParams(ProtocolError):
    rpc_code = -32602


class Refusal(RelayError):
    """A policy decision. ``code`` is a :class:`Code`; it lands in ``error.data.code``."""

    rpc_code = REFUSAL_RPC_CODE

    def __init__(self, code: Code | str, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message, data=data)
        self.code = Code(code)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"{type(self).__name__}({self.code.value}: {self.message})"

    def to_error_data(self) -> dict[str, Any]:
        """The JSON-RPC ``error.data`` object: the stable code plus any extra fields."""
        return {"code": self.code.value, **self.data}


class GateRefusal(Refusal):
    """The gate said no (grant, scope, budget, consent)."""


class RoutingRefusal(Refusal):
    """The caller may not do this to this object (originator, existence, state)."""


class WorkspaceRefusal(Refusal):
    """A scratch-workspace rule said no (path, quota, edit match, digest)."""


class ConfigRefusal(Refusal):
    """Something is not configured (backend, credentials, model allowlist)."""
