"""Crash repair (docs/runtime.md, crash repair): what a dead broker left unfinished.

Runs the journal shows unfinished *and owned by a dead broker* (storage/leases.py: a run of a live
broker on the same data directory is never touched) become ``interrupted`` with one
``run.interrupted`` event each. Every tool call the model made in them is answered in the stored
conversation, never re-executed:

- an intent without an outcome: "outcome unknown; the action may have happened";
- an outcome the journal recorded but the conversation never got (a turn's results are stored together
  once all its calls are done): "completed before the broker stopped ... the action happened";
- no journal record at all: "not run".

A permission request the dead broker left pending gets its ``permission.resolved`` (decision
``withdrawn``, ``answered_by: "recovery"``), so a panel replaying events shows no card nobody can answer.

**Idempotent at every write.** Each run is repaired in *one* store transaction: the
calls' "outcome unknown" records, the answered conversation, the permission resolutions, the
``interrupted`` marker and the ``run.interrupted`` event commit together or not at all. A crash
anywhere in recovery leaves each run either fully repaired or untouched (still unfinished, owner
still dead), and the next start repairs the rest. Events are delivered live only after the commit.

``RELAY_TEST_CRASH_AT`` (tests only): ``recovery:N`` ends the process with ``os._exit`` at the Nth
write point of recovery (before and after each run's transaction, and between the writes inside it),
which is how tests/runtime/test_recovery_crash.py kills recovery at each of them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from typing import Any

from ..core.ports import ConversationStore, EventSink, Store
from ..protocol.names import EventType
from ..storage.errors import StoreError
from .context import OUTCOME_UNKNOWN, tool_result_block

__all__ = ["charge_dead_holds", "recover", "stored_messages"]

log = logging.getLogger(__name__)

_CRASH_ENV = "RELAY_TEST_CRASH_AT"
_points = 0


def _crash_point() -> None:
    """Test hook: exit at the Nth write point when ``RELAY_TEST_CRASH_AT=recovery:N``."""
    spec = os.environ.get(_CRASH_ENV, "")
    if not spec.startswith("recovery:"):
        return
    global _points
    _points += 1
    if _points == int(spec.split(":", 1)[1]):
        os._exit(137)  # like SIGKILL: no cleanup, no flush


def recover(store: Store, conversations: ConversationStore, events: EventSink | None, *, live: set[str] | None = None,
            skip: Collection[str] = ()) -> list[str]:
    """Repair what dead brokers left unfinished (see the module docstring). Returns the ids of the
    runs marked ``interrupted``. ``events`` is the event bus (None: deliver nothing live).

    ``live``: the live owners as the caller read them (default: read now). It only selects the
    candidates: each run's owner is judged again inside the run's write transaction, so a broker that
    took its lease and started a run after ``live`` was read is alive and its run is left alone.
    ``skip``: runs the caller knows are alive (the run manager's own, in memory): never touched."""
    live = store.live_owners() if live is None else live
    done: list[str] = []
    for row in store.runs_to_recover(live):
        if row["run_id"] in skip:
            continue
        _crash_point()
        try:
            stored = _repair_run(store, conversations, row)
        except StoreError as exc:  # a full disk: the run stays unfinished, the next check repairs it
            log.error("relay: could not recover run %s: %s", row["run_id"], exc.message)
            break
        _crash_point()
        if stored is not None:
            done.append(row["run_id"])
            _publish(events, store, stored)
    # requests of dead brokers not tied to a run that was just repaired (a client's tools.call);
    # re-read inside the write lock: another live broker may be resolving the same ones
    if store.pending_permissions(live=live):
        _crash_point()
        try:
            with store.transaction():
                orphans = [p for p in store.pending_permissions(live=store.live_owners())
                           if p.get("run_id") not in skip]
                stored = store.append_events_framed([_resolved(p) for p in orphans]) if orphans else None
        except StoreError as exc:
            log.error("relay: could not resolve permission requests of a stopped broker: %s", exc.message)
        else:
            _crash_point()
            if stored is not None:
                _publish(events, store, stored)
    charge_dead_holds(store)
    return done


def charge_dead_holds(store: Store) -> int:
    """The budget holds of dead brokers are charged at their full amount now (one transaction), not
    only when they expire minutes later: the requests they covered may have been sent (docs/gate.md §6)."""
    try:
        charged = store.charge_dead_holds()
    except StoreError as exc:  # a full disk: the holds stay counted as held, and expire as before
        log.error("relay: could not charge the budget holds of a stopped broker: %s", exc.message)
        return 0
    if charged:
        log.info("relay: charged %d budget hold(s) of a stopped broker at their reserved amount", charged)
    return charged


def _repair_run(store: Store, conversations: ConversationStore, row: dict[str, Any]) -> Any:
    """One run, one transaction. None when the run was no longer unfinished (another broker's
    recovery got there first) or its owner is alive after all (judged inside the transaction)."""
    run_id = row["run_id"]
    owner = row.get("owner")
    with store.transaction():
        current = store.get_run(run_id)
        if current is None or current.get("finished_at") is not None:
            return None
        if owner is not None and owner in store.live_owners():
            return None
        finished = {c["call_id"]: c["outcome"] for c in current.get("calls") or []
                    if isinstance(c.get("outcome"), dict)}
        unknown = {c["call_id"] for c in current.get("calls") or [] if c.get("outcome") is None}
        for call_id in sorted(unknown):
            store.call_outcome(run_id, call_id, {"status": "unknown", "outcome_unknown": True})
            _crash_point()
        conversation = row.get("conversation")
        if conversation:
            _repair_history(conversations, conversation, row.get("origin", ""), unknown, finished)
            _crash_point()
        items = [_resolved(p) for p in store.pending_permissions(run_id=run_id)]
        items.append((EventType.INTERRUPTED, {"run_id": run_id, "conversation": conversation,
                                              "outcome_unknown": sorted(unknown)}, row.get("origin"), run_id))
        return store.finish_run(run_id, "interrupted", None, items)


def _resolved(pending: dict[str, Any]) -> tuple[str, dict[str, Any], str | None, str | None]:
    return (EventType.PERMISSION_RESOLVED,
            {"request_id": pending["request_id"], "decision": "withdrawn", "scope": "once",
             "answered_by": "recovery", "answered_at": None,
             "reason": "broker stopped"},
            pending.get("origin"), pending.get("run_id"))


def _publish(events: EventSink | None, store: Any, stored: tuple[list[Any], list[bytes]]) -> None:
    """Deliver committed events live (None: nobody listens; the store has them)."""
    if events is not None:
        events.publish_stored(*stored)


def _repair_history(conversations: ConversationStore, conversation: str, origin: str, unknown: set[str],
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
        conversations.append_messages(conversation, row.get("origin") or origin, row.get("name", ""), len(history),
                                      [{"role": "user", "content": blocks, "turn": turn}], row.get("meta") or {})


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
