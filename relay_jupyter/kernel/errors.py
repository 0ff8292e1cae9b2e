"""Errors a notebook user sees from ``%%agent``: one clear line, and the cell fails.

IPython calls ``_render_traceback_`` on an exception that has it and prints only the lines it
returns, so an :class:`AgentError` shows as one line (no traceback) while the cell still ends
with status ``error`` -- nbclient / nbval / "Run all" stop there, so there is no false green.

One error tree (issue 14 item 6): :class:`AgentError` is a ``core.errors.RelayError``, and its
``code`` is the broker's own :class:`~relay_jupyter.core.errors.Code` member whenever the failure
has one (``BUDGET_EXCEEDED``, ``UNAUTHORIZED``, ``CANCELLED``, ...), so kernel code and user code
match on the same codes the broker sends in ``error.data.code``. Only two kinds of code are not a
``Code``: a JSON-RPC transport failure (``RPC<number>``, e.g. ``RPC-32601``) and a code a newer broker
sent that this kernel does not know yet (kept as the string it was). :func:`as_agent_error` turns any
other ``RelayError`` (a core ``Refusal`` raised in the kernel) into the same one-line form.
``core.errors`` is plain Python (no pydantic), so importing it costs ``%load_ext`` nothing.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import Code, RelayError
from .rendering import visible

__all__ = ["AgentError", "AgentUsageError", "BrokerUnreachable", "RpcError", "as_agent_error", "as_code",
           "message_for"]


def as_code(code: Code | str | None) -> Code | str | None:
    """The broker's :class:`Code` for ``code`` when it is one; otherwise the string as given (or None)."""
    if code is None or isinstance(code, Code):
        return code
    try:
        return Code(str(code))
    except ValueError:
        return str(code)


class AgentError(RelayError):
    """A failure the user can act on. Renders as one line: ``relay: <message>``."""

    def __init__(self, message: str, *, code: Code | str | None = None, data: dict[str, Any] | None = None) -> None:
        super().__init__(message, data=data)
        self.code: Code | str | None = as_code(code)

    def _render_traceback_(self) -> list[str]:
        # one line, red like an IPython error name, no stack: the stack would only hide the message
        return [f"\x1b[0;31mrelay:\x1b[0m {self.message}"]

    def __str__(self) -> str:
        return self.message


class AgentUsageError(AgentError):
    """The magic line could not be parsed (unknown option, bad value)."""


class BrokerUnreachable(AgentError):
    """No broker answered at the configured or discovered address."""


class RpcError(AgentError):
    """The broker answered a JSON-RPC call with an error.

    ``code`` is the stable refusal string from ``error.data.code`` when there is one
    (``BUDGET_EXCEEDED``, ``NO_BACKEND``, ...), else ``RPC<number>`` for transport codes.
    """

    def __init__(self, rpc_code: int, message: str, data: dict[str, Any] | None = None,
                 method: str | None = None) -> None:
        data = dict(data or {})
        stable = data.get("code") if isinstance(data.get("code"), str) else None
        line = message_for(stable, message)
        if rpc_code == -32601 and method:
            line = f"the relay broker does not offer {method} (is relay-jupyter up to date on the server?)"
        elif rpc_code == -32602 and method:
            line = f"the relay broker rejected the parameters of {method}: {line}"
        super().__init__(line, code=stable or f"RPC{rpc_code}", data=data)
        self.rpc_code = rpc_code
        self.raw_message = message


# What to do about each stable code, appended to the broker's own message so the line is actionable.
_HINTS: dict[str, str] = {
    "NO_BACKEND": "configure a backend in the relay server config (c.RelayApp.anthropic_api_key or openai_base_url)",
    "NO_ENGINE": "the engine is not available on this relay server: its message says what to install (docs/engines.md)",
    "NO_CREDENTIALS": "set the API key in the relay server config or its 0600 secrets file, not in the kernel",
    "MODEL_NOT_ALLOWED": "pick a model the broker allows with --model, or widen the grant",
    "BUDGET_EXCEEDED": "the budget for this notebook is used up; see relay.budget() or raise the grant's limits",
    "PERMISSION_TIMEOUT": "nobody answered the permission request in time, so it was denied",
    "UNAUTHORIZED": "this notebook has no grant (not connected yet, revoked, or the notebook was renamed); run "
                    "the cell again to see the connect card",
    "SCOPE_EXCEEDED": "the tool is not in this notebook's grant; see relay.grants()",
    "CONSENT_DENIED": "the action was denied",
    # the broker's backend messages already end with these sentences (backends/base.py ADVICE): not repeated
    "BACKEND_UNREACHABLE": "check that the model server is running and that its URL in the relay server config "
                           "is right, then run the cell again",
    "BACKEND_TIMEOUT": "the model server is slow or stuck: run the cell again, or raise c.RelayApp.turn_timeout / "
                       "turn_idle_timeout if long answers are expected",
    "BACKEND_ERROR": "run the cell again; if it keeps failing, check the model server's logs or status page",
}


def as_agent_error(exc: RelayError) -> AgentError:
    """Any error of the tree as the kernel's one-line error (a core ``Refusal`` keeps its code and hint)."""
    if isinstance(exc, AgentError):
        return exc
    code = getattr(exc, "code", None)
    return AgentError(message_for(str(code) if code else None, exc.message), code=code, data=exc.data)


def message_for(code: str | None, message: str) -> str:
    """One line for a stable code: the broker's message plus what to do (never a secret)."""
    # one line, and a terminal escape or bidi override in a broker or server message is shown, not obeyed
    line = visible(" ".join(str(message).split())) or (code or "error")
    hint = _HINTS.get(code or "")
    if code:
        line = f"{line} [{code}]"
    if hint and hint.lower() not in line.lower():
        line = f"{line} -- {hint}"
    return line
