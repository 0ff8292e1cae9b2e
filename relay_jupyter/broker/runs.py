"""``run.start``, ``run.cancel`` and ``conversations.*``. The runtime is wired into a :class:`Broker` by
:func:`~relay_jupyter.broker.runtime_setup.install_runtime` (re-exported here for older imports).

Who may do what:

- ``run.start``: a kernel or daemon client runs for its own origin; a browser session names one.
  The caller becomes the run's originator: only it answers the run's permission requests.
- ``run.cancel``: the originator, or a browser session of the server's user. Another client of the
  same origin gets ``NOT_ORIGINATOR``; a client of another origin gets ``NOT_FOUND`` (existence is
  not leaked across notebooks).
- ``conversations.*``: conversations of the caller's origin (browser: any origin).

Conversation names are the client's (a kernel calls its chat ``default``); the broker keys them by
origin (:func:`conversation_key`), so two notebooks' ``default`` chats — and their scratch
workspaces — never meet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..backends.registry import spec as backend_spec
from ..core.caller import Caller, CallerKind
from ..core.errors import Code, ConfigRefusal, RoutingRefusal
from ..core.types import PermissionMode
from ..protocol.models_runs import (
    ConversationsDeleteParams,
    ConversationsDeleteResult,
    ConversationsForkParams,
    ConversationsForkResult,
    ConversationsListParams,
    ConversationsListResult,
    RunCancelParams,
    RunCancelResult,
    RunStartParams,
    RunStartResult,
)
from ..protocol.names import Method
from ..runtime.conversations import fork_history, next_turn
from ..runtime.manager import RunContext, RunManager, RunParams
from .conversation_keys import conversation_key, conversation_name
from .registry import method
from .runtime_setup import backends_from_config, install_runtime
from .tool_sources import BrokerTools

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["install_runtime", "backends_from_config", "BrokerTools", "conversation_key"]


def _public(row: dict[str, Any]) -> dict[str, Any]:
    """A stored conversation row as its client knows it: the name of its (origin, name) key."""
    return {**row, "conv_id": conversation_name(row.get("conv_id", ""), row.get("origin"))}


# -- methods ---------------------------------------------------------------------------------------

def _runs(broker: Broker) -> RunManager:
    from .broker import require

    return require(broker.runs, "the agent runtime")


def _target(caller: Caller, requested: str | None) -> str:
    from .broker import target_origin

    return target_origin(caller, requested)


def _conversations(broker: Broker) -> Any:
    return _runs(broker).conversations


def _owned(broker: Broker, caller: Caller, conversation: str, origin: str | None) -> tuple[str, dict[str, Any]]:
    """(key, row) of the caller's conversation, to change it: NOT_FOUND for anything else, CONFLICT while a
    run is using it."""
    origin = _target(caller, origin)
    key = conversation_key(origin, conversation)
    row = _conversations(broker).load_conversation(key)
    if row is None or (caller.kind is not CallerKind.BROWSER and row.get("origin") != caller.origin) \
            or (origin is not None and row.get("origin") != origin):
        raise RoutingRefusal(Code.NOT_FOUND, f"no conversation {conversation}")
    if _runs(broker).busy(key):
        raise RoutingRefusal(Code.CONFLICT, "this conversation has a running agent; cancel it first")
    return key, row


@method(Method.RUN_START, RunStartParams, RunStartResult,
        doc="Start an agent run in a conversation; events carry its progress and exactly one terminal event.")
async def run_start(broker: Broker, caller: Caller, params: RunStartParams) -> RunStartResult:
    runs = _runs(broker)
    origin = _target(caller, params.origin)
    key = conversation_key(origin, params.conversation)
    existing = runs.conversations.load_conversation(key)
    if existing is not None and existing.get("origin") != origin:
        # a conversation id of another notebook: same answer as a busy one would leak it, so refuse plainly
        raise RoutingRefusal(Code.NOT_FOUND, f"no conversation {params.conversation} for this notebook")
    backend = params.backend or broker.config.default_backend
    if backend not in runs.backends:
        declared = backend_spec(backend)  # the registry's one-line hint for a known, unconfigured backend
        raise ConfigRefusal(declared.missing_code if declared else Code.NO_BACKEND,
                            declared.missing_hint if declared else f"no backend named {backend!r}")
    ctx = RunContext(origin=origin, client_id=caller.client_id, conversation=key,
                     user=caller.user, caller_kind=caller.kind.value)
    run_id = await runs.start(ctx, RunParams(
        prompt=params.prompt, model=params.model or broker.config.default_model, backend=backend,
        attachments=[a.model_dump() for a in params.attachments], mode=PermissionMode(params.mode),
        max_tokens=params.max_tokens, tools=params.tools))
    return RunStartResult(run_id=run_id)


@method(Method.RUN_CANCEL, RunCancelParams, RunCancelResult,
        doc="Cancel a run: only its originator or a browser session of the server's user.")
async def run_cancel(broker: Broker, caller: Caller, params: RunCancelParams) -> RunCancelResult:
    runs = _runs(broker)
    active = runs.get(params.run_id)
    if active is None:
        get_run = getattr(broker.store, "get_run", None)
        row = get_run(params.run_id) if get_run is not None else None
        if row is None or (caller.kind is not CallerKind.BROWSER and row.get("origin") != caller.origin):
            raise RoutingRefusal(Code.NOT_FOUND, f"no run {params.run_id}")
        return RunCancelResult(cancelled=False)
    if caller.kind is not CallerKind.BROWSER:
        if active["origin"] != caller.origin:
            raise RoutingRefusal(Code.NOT_FOUND, f"no run {params.run_id}")
        if active["originator"] != caller.client_id:
            raise RoutingRefusal(Code.NOT_ORIGINATOR, "only the client that started this run can cancel it")
    return RunCancelResult(cancelled=runs.cancel(params.run_id))


@method(Method.CONVERSATIONS_LIST, ConversationsListParams, ConversationsListResult,
        doc="Conversations of the caller's origin (browser: all, or the named origin), newest first.")
async def conversations_list(broker: Broker, caller: Caller, params: ConversationsListParams
                             ) -> ConversationsListResult:
    scope = None if caller.kind is CallerKind.BROWSER and params.origin is None else _target(caller, params.origin)
    return ConversationsListResult(conversations=[_public(row) for row in
                                                  _conversations(broker).list_conversations(scope)])


@method(Method.CONVERSATIONS_FORK, ConversationsForkParams, ConversationsForkResult,
        doc="Drop turn at_turn and every later one (re-running an earlier cell replaces its turn).")
async def conversations_fork(broker: Broker, caller: Caller, params: ConversationsForkParams
                             ) -> ConversationsForkResult:
    runs = _runs(broker)
    key, row = _owned(broker, caller, params.conversation, params.origin)
    messages = list(row.get("messages") or [])
    kept = fork_history(messages, params.at_turn)
    runs.conversations.save_conversation(key, row["origin"], row.get("name", ""), kept,
                                         row.get("meta") or {})
    return ConversationsForkResult(conversation=params.conversation, removed_messages=len(messages) - len(kept),
                                   turns=next_turn(kept))


@method(Method.CONVERSATIONS_DELETE, ConversationsDeleteParams, ConversationsDeleteResult,
        doc="Delete a conversation and its scratch workspace.")
async def conversations_delete(broker: Broker, caller: Caller, params: ConversationsDeleteParams
                               ) -> ConversationsDeleteResult:
    runs = _runs(broker)
    key, _ = _owned(broker, caller, params.conversation, params.origin)
    deleted = runs.conversations.delete_conversation(key)
    ws_deleted = False
    ws = broker.workspace_tools
    if ws is not None and hasattr(ws, "delete_conversation"):
        ws_deleted = bool(ws.delete_conversation(key))
    return ConversationsDeleteResult(deleted=deleted, workspace_deleted=ws_deleted)
