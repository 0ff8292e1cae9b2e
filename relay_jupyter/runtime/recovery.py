"""Crash repair at broker start (DESIGN.md §4 durability).

Runs the journal shows unfinished become ``interrupted`` (one ``run.interrupted`` event each). Every
tool call the model made in them is answered in the stored conversation, never re-executed:

- an intent without an outcome: "outcome unknown; the action may have happened";
- an outcome the journal recorded but the conversation never got (a turn's results are stored together
  once all its calls are done): "completed before the broker stopped ... the action happened";
- no journal record at all: "not run".
"""

from __future__ import annotations

from typing import Any

from ..protocol.names import EventType
from .context import OUTCOME_UNKNOWN, tool_result_block

__all__ = ["recover", "stored_messages"]


def recover(journal: Any, conversations: Any, events: Any) -> list[str]:
    """At broker start: unfinished runs become ``interrupted``; every call with an intent and
    no outcome is answered "outcome unknown" in its stored conversation (never re-executed)."""
    rows = {r["run_id"]: r for r in journal.list_runs(limit=1_000_000)
            if r.get("finished_at") is None}
    if hasattr(journal, "mark_interrupted"):
        ids = list(journal.mark_interrupted())
    else:
        ids = list(journal.unfinished_runs())
        for run_id in ids:
            journal.run_finished(run_id, "interrupted")
    for run_id in ids:
        row = rows.get(run_id, {})
        finished = _finished_calls(journal, run_id)
        unknown = {c["call_id"] for c in journal.calls_without_outcome(run_id)}
        for call_id in unknown:
            journal.call_outcome(run_id, call_id, {"status": "unknown", "outcome_unknown": True})
        conversation = row.get("conversation")
        if conversation:
            _repair_history(conversations, conversation, row.get("origin", ""), unknown, finished)
        events.append(EventType.INTERRUPTED, {"run_id": run_id, "conversation": conversation,
                                                   "outcome_unknown": sorted(unknown)},
                           origin=row.get("origin"), run_id=run_id)
    return ids


def _finished_calls(journal: Any, run_id: str) -> dict[str, dict[str, Any]]:
    """Calls of ``run_id`` whose outcome the journal recorded before the crash (their results were
    only in memory: a turn's results are stored together once every call of the turn is done).
    Needs a journal with ``get_run`` (the SQLite store; an in-memory journal does not outlive a crash)."""
    get_run = getattr(journal, "get_run", None)
    run = get_run(run_id) if get_run is not None else None
    return {c["call_id"]: c["outcome"] for c in (run or {}).get("calls") or []
            if isinstance(c.get("outcome"), dict)}


def _repair_history(conversations: Any, conversation: str, origin: str, unknown: set[str],
                    finished: dict[str, dict[str, Any]] | None = None) -> None:
    row = conversations.load_conversation(conversation) or {}
    history = stored_messages(row)
    if not history:
        return
    answered = {b.get("tool_use_id") for m in history if m.get("role") == "user"
                for b in m.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool_result"}
    blocks, turn = [], None
    for m in history:
        if m.get("role") != "assistant":
            continue
        for b in m.get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") not in answered:
                turn = m.get("turn", turn)
                text, is_error = _recovered_answer(b["id"], unknown, finished or {})
                blocks.append(tool_result_block(b["id"], b.get("name", ""), text, is_error))
    if blocks:
        history.append({"role": "user", "content": blocks, "turn": turn})
        conversations.save_conversation(conversation, row.get("origin") or origin, row.get("name", ""),
                                             history, row.get("meta") or {})


def _recovered_answer(call_id: str, unknown: set[str], finished: dict[str, dict[str, Any]]) -> tuple[str, bool]:
    """The result a crash-repaired call gets: never "not run" for a call the journal saw run."""
    outcome = finished.get(call_id)
    if call_id in unknown or (outcome is not None and outcome.get("outcome_unknown")):
        return OUTCOME_UNKNOWN, True
    if outcome is not None:
        status = str(outcome.get("status") or "unknown")
        return (f"completed before the broker stopped (status: {status}), but its output was lost; "
                "the action happened: check its effect before repeating it"), status != "ok"
    return "not run: the broker stopped before this call started", True


def stored_messages(row: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The messages of a stored conversation row (empty for none or a malformed one)."""
    messages = (row or {}).get("messages")
    return list(messages) if isinstance(messages, list) else []
