"""``conversations.*``: the chats of a notebook (list, fork at a turn, delete with their scratch workspace).

Conversation names are the client's (a kernel calls its chat ``default``); the broker keys them by the pair
(origin, name) (:func:`~relay_jupyter.broker.conversation_keys.conversation_key`), so two notebooks'
``default`` chats — and their scratch workspaces — never meet.

Access (:data:`~._access.NOTEBOOK`): a kernel lists and changes its own origin's conversations; a browser
session names the origin (``conversations.list`` without one: every origin's). Another notebook's
conversation looks missing (``NOT_FOUND``); one with a running agent is ``CONFLICT``.
"""

from __future__ import annotations

from typing import Any

from ...core.errors import Code, RoutingRefusal
from ...runtime.offload import off_loop
from ...protocol.models_runs import (
    ConversationsDeleteParams,
    ConversationsDeleteResult,
    ConversationsForkParams,
    ConversationsForkResult,
    ConversationsListParams,
    ConversationsListResult,
)
from ...protocol.names import Method
from ...runtime.conversations import fork_history, next_turn
from ..conversation_keys import conversation_key, conversation_name
from ..sessions import is_session_row
from ._access import NOTEBOOK, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "conversations")


def _runtime(req: Request) -> Any:
    from ..broker import require

    return require(req.broker.runs, "the agent runtime")


def _public(row: dict[str, Any]) -> dict[str, Any]:
    """A stored conversation row as its client knows it: the name of its (origin, name) key."""
    return {**row, "conv_id": conversation_name(row.get("conv_id", ""), row.get("origin"))}


def _owned(req: Request, conversation: str, key: str) -> dict[str, Any]:
    """The stored row of the call's conversation, to change it (called on a store thread while the
    conversation is claimed): NOT_FOUND for anything else."""
    row = _runtime(req).conversations.load_conversation(key)
    if row is None or row.get("origin") != req.target:
        raise RoutingRefusal(Code.NOT_FOUND, f"no conversation {conversation}")
    return row


_BUSY = "this conversation has a running agent; cancel it first"


@rpc.method(Method.CONVERSATIONS_LIST, ConversationsListParams, ConversationsListResult, scope=Scope.ANY,
            doc="Conversations of the caller's origin (browser: all, or the named origin), newest first.")
async def conversations_list(req: Request, params: ConversationsListParams) -> ConversationsListResult:
    rows = req.keep(await off_loop(_runtime(req).conversations.list_conversations, req.origin))
    # the endpoints' stored session histories share the table (broker/sessions.py): not chats
    return ConversationsListResult(conversations=[_public(row) for row in rows if not is_session_row(row)])


@rpc.method(Method.CONVERSATIONS_FORK, ConversationsForkParams, ConversationsForkResult,
            doc="Drop turn at_turn and every later one (re-running an earlier cell replaces its turn).")
async def conversations_fork(req: Request, params: ConversationsForkParams) -> ConversationsForkResult:
    key = conversation_key(req.target, params.conversation)

    def fork() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        row = _owned(req, params.conversation, key)
        messages = list(row.get("messages") or [])
        kept = fork_history(messages, params.at_turn)
        _runtime(req).conversations.save_conversation(key, row["origin"], row.get("name", ""), kept,
                                                      row.get("meta") or {})
        return messages, kept

    # the load and the rewrite on a store thread (runtime/offload.py), the conversation claimed meanwhile:
    # a run.start in between is CONFLICT, as one before would be
    with _runtime(req).claim(key, _BUSY):
        messages, kept = await off_loop(fork)
    return ConversationsForkResult(conversation=params.conversation, removed_messages=len(messages) - len(kept),
                                   turns=next_turn(kept))


@rpc.method(Method.CONVERSATIONS_DELETE, ConversationsDeleteParams, ConversationsDeleteResult,
            doc="Delete a conversation and its scratch workspace.")
async def conversations_delete(req: Request, params: ConversationsDeleteParams) -> ConversationsDeleteResult:
    key = conversation_key(req.target, params.conversation)

    def delete() -> bool:
        _owned(req, params.conversation, key)
        return bool(_runtime(req).conversations.delete_conversation(key))

    ws = req.broker.workspace_tools
    with _runtime(req).claim(key, _BUSY):  # the workspace too: a run started in between would lose its files
        deleted = await off_loop(delete)
        ws_deleted = bool(ws.delete_conversation(key)) if ws is not None else False
    return ConversationsDeleteResult(deleted=deleted, workspace_deleted=ws_deleted)
