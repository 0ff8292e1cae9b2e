"""The seams between the pure core and the layers that implement it.

Each port is a small Protocol. :class:`Store` is the one contract of everything the broker
persists (grants, the ledger and its holds, events, the runs journal, conversations, saved trust,
MCP pins, checkpoints, leases, storage health, telemetry rows); it is the union of the small ports below, with no
optional methods: a caller never probes a store with ``hasattr``. Implementations:

- ``relay_jupyter.core.memory.MemoryStore``: the in-memory reference (tests, ``in_memory`` brokers);
- ``relay_jupyter.storage.sqlite.Store``: SQLite (WAL), one connection, one file per data dir;
- a shared-database store (PostgreSQL) implements the same protocol.

Every implementation must pass the contract suite ``relay_jupyter.testing.store_contract``
(docs/storage.md). The audit log is its own port (:class:`AuditSink`): its durable copy is the
tamper-evident JSON-lines file of the data dir (``storage.audit_log.AuditLog``), which also answers
the query side (``tail``); a shared store may provide an ``AuditSink`` of its own.

Common rules for every method below:

- Malformed arguments (an empty id, a NUL in a string, a negative amount, a non-dict payload) raise
  ``TypeError`` / ``ValueError`` and write nothing; unknown runs / calls raise ``KeyError``.
- A write that the storage refuses at run time (a full disk, an I/O error) raises
  ``StorageUnavailable`` (a ``Refusal`` with code ``STORAGE_FULL`` / ``STORAGE_ERROR``), writes
  nothing, and sets :attr:`Store.storage_problem` until a later write commits.
- Values handed out are fresh (dicts, lists) or immutable (pydantic models, frozen dataclasses): a
  caller cannot change the store's state through them.
- Every method is thread-safe (the broker calls the store from worker threads and the loop).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .errors import Refusal
from .telemetry import TelemetryStore
from .types import AuditRecord, ConsentRequest, ConsentResult, Event, Grant, ToolClass

__all__ = [
    "AuditSink",
    "Checkpoint",
    "CheckpointStore",
    "ConsentPort",
    "ConversationStore",
    "EventItem",
    "EventStore",
    "GrantStore",
    "LeaseStore",
    "Ledger",
    "PinStore",
    "RunJournal",
    "Store",
    "TeamLimitStore",
    "TelemetryStore",
    "TrustStore",
]

EventItem = tuple[str, dict[str, Any], str | None, str | None]
"""An event to append: ``(type, data, origin, run_id)``; origin None is a broadcast."""


@runtime_checkable
class GrantStore(Protocol):
    def get_grant(self, origin: str) -> Grant | None:
        """The stored grant of ``origin`` (expired or not), or None."""
    def put_grant(self, grant: Grant) -> None:
        """Insert or replace. Narrowing checks are the caller's (``core.grants``) job."""
    def delete_grant(self, origin: str) -> bool:
        """Remove the grant of ``origin``; True if there was one."""
    def list_grants(self) -> list[Grant]:
        """Every stored grant, ordered by origin."""


@runtime_checkable
class Ledger(Protocol):
    """Per-origin per-day usage. ``day`` is an ISO date string (UTC)."""

    def usage(self, origin: str, day: str) -> tuple[int, float]:
        """(tokens, cost_usd) committed so far."""
    def add_usage(self, origin: str, day: str, tokens: int, cost_usd: float) -> None:
        """Add to the committed usage atomically (concurrent adds never lose an update). A negative
        or non-finite amount raises ValueError: the ledger only grows."""
    # Holds (reservations) of requests in flight, kept in the store itself so that every broker on
    # one data dir sees them: ``hold`` checks and inserts atomically (one transaction), ``finish_hold``
    # commits the usage and drops the hold in one transaction (see core/budgets.py).
    def held(self, origin: str, day: str) -> tuple[int, float]:
        """(tokens, cost_usd) held by live (not yet charged) reservations."""
    def hold(self, origin: str, day: str, tokens: int, cost_usd: float, *, now: float, expires_at: float,
             check: Callable[[int, float, int, float], None]) -> str:
        """**Atomic** across every thread and every process sharing the store: charge expired holds
        (as :meth:`sweep_holds`), read the day's committed usage and live holds, call
        ``check(used_tokens, used_cost, held_tokens, held_cost)`` (it raises to refuse: nothing is
        written) and insert the hold. Two concurrent ``hold`` calls never both pass a check the
        second would fail with the first's hold counted: holds never overspend. Returns a new id."""
    def finish_hold(self, hold_id: str, tokens: int | None, cost_usd: float | None) -> bool:
        """One transaction: commit ``tokens``/``cost_usd`` (None: nothing, the request was never sent)
        and drop the hold. A hold already charged by :meth:`sweep_holds` adds only what exceeds its
        amount. Idempotent: a second call for the same id commits nothing and returns False. True
        when the hold was live (neither finished nor expired)."""
    def sweep_holds(self, now: float) -> int:
        """Charge every live hold whose ``expires_at`` is <= ``now`` at its full amount (its broker
        died: the request may have been sent); charged holds are forgotten a day after expiry.
        Returns how many were charged; a second sweep at the same time charges nothing."""
    def charge_dead_holds(self) -> int:
        """Charge at its full amount, now, every live hold taken by a broker whose lease is dead (as
        expiry would later: the request may have been sent), in one transaction that judges the owners;
        a hold of a live broker, or with no owner, is left alone. Returns how many were charged; a
        second call charges nothing (crash recovery, runtime/recovery.py)."""


@runtime_checkable
class AuditSink(Protocol):
    def append(self, record: AuditRecord) -> AuditRecord:
        """Append and return the record with its sequence number set (from 1, strictly increasing,
        unique across every writer of the same log). Raises StorageUnavailable when it could not be
        recorded: the caller (the gate) then must not run what it could not audit."""
    def tail(self, n: int = 100, *, origin: str | None = None,
             where: Callable[[AuditRecord], bool] | None = None) -> list[AuditRecord]:
        """The last ``n`` records (oldest first), optionally only those of ``origin``. Never blocks
        :meth:`append` for the time of a read."""
    def close(self) -> None:
        """Flush (fsync) and release the log. Idempotent."""


@runtime_checkable
class ConsentPort(Protocol):
    async def ask(self, request: ConsentRequest) -> ConsentResult:
        """Decide allow | deny | timeout. Must return by ``request.deadline`` (TIMEOUT otherwise)."""


@runtime_checkable
class EventSink(Protocol):
    """Where the runtime sends a run's events: the broker's ``EventBus`` (broker/events.py), or a
    test's recorder. Every method is required (the runtime never probes for one)."""

    def append(self, type: str, data: dict[str, Any] | None = None, *, origin: str | None = None,
               run_id: str | None = None) -> Any:
        """Store one event and deliver it to its live subscribers."""
    def publish_stored(self, events: Sequence[Event], frames: Sequence[bytes] | None = None) -> None:
        """Deliver events the caller already committed (a run's terminal event, stored in one
        transaction with the journal's terminal state)."""
    def publish_unstored(self, type: str, data: dict[str, Any], origin: str | None, run_id: str | None) -> None:
        """Deliver an event the store could not record (a full disk), marked ``stored: false``."""
    def append_soon(self, type: str, data: dict[str, Any], *, origin: str | None, run_id: str | None,
                    on_error: Callable[[Exception], None]) -> None:
        """Group commit: queue an event to be stored with the others of this loop turn in one
        transaction, then delivered; a failed store calls ``on_error`` (broker/events.py)."""
    def flush(self) -> None:
        """Store and deliver what :meth:`append_soon` queued (before a run's terminal event)."""


@runtime_checkable
class EventStore(Protocol):
    """The durable event log. Ids are strictly increasing in append order, never reused (not even
    after pruning); events of one batch get consecutive ids; retention removes only a prefix."""

    def append_event(self, type: str, data: dict[str, Any], *, origin: str | None = None,
                     run_id: str | None = None) -> Event:
        """Append one event; returns it with its id."""
    def append_events(self, items: Sequence[EventItem]) -> list[Event]:
        """Batch append of (type, data, origin, run_id): one transaction, all or none; a malformed
        item raises before anything is written. Inside :meth:`Store.transaction` the batch commits
        with that transaction."""
    def append_events_framed(self, items: Sequence[EventItem]) -> tuple[list[Event], list[bytes]]:
        """:meth:`append_events`, also returning each event's SSE frame, equal byte for byte to
        ``protocol.sse.encode_event(event)`` (the bus delivers it without encoding again)."""
    def events_since(self, since: int, *, limit: int | None = None,
                     origins: Collection[str] | None = None) -> list[Event]:
        """Events with id > ``since``, oldest first, at most ``limit`` (<= 0: none). ``origins``
        keeps broadcast events and those of the given origins (None: every event). A negative
        ``since`` replays from the start. TypeError for a non-integer ``since`` / ``limit``."""
    def replay_sse(self, since: int, *, limit: int | None = None,
                   origins: Collection[str] | None = None) -> tuple[int, bytes]:
        """The SSE frames of what :meth:`events_since` returns, concatenated, and the id of the last
        event *scanned* (``since`` when none): a caller pages with ``since = last`` until ``b""``
        with ``last == since``. ``limit`` bounds the events scanned per page, so a page is bounded
        work even when the caller may see none of them."""
    def last_event_id(self) -> int:
        """Id of the newest event ever appended (0 when none); survives pruning."""
    def first_event_id(self) -> int:
        """Id of the oldest retained event; when none is retained, the id the next event gets."""
    def prune_events(self, max_age_s: float | None = None, max_count: int | None = None) -> int:
        """Drop the oldest events: those older than ``max_age_s`` (stopping at the first one young
        enough) and all but the newest ``max_count``. Returns how many went. Works in bounded pages
        (no long write lock) and returns freed space to the file system where it can."""


@runtime_checkable
class RunJournal(Protocol):
    """Durable run and tool-call records (docs/runtime.md durability)."""

    def run_started(self, run_id: str, origin: str, conversation: str, meta: dict[str, Any]) -> None:
        """Record a new run in state ``running``, owned by this store's lease (:attr:`owner_id`)."""
    def run_finished(self, run_id: str, state: str, meta: dict[str, Any] | None = None) -> None:
        """Mark a run terminal with ``state`` (not ``running``); ``meta`` is merged. KeyError for an
        unknown run."""
    def finish_run(self, run_id: str, state: str, meta: dict[str, Any] | None,
                   terminal: Sequence[EventItem]) -> tuple[list[Event], list[bytes]] | None:
        """**The one place a run becomes terminal**: in one transaction, mark the run ``state`` only
        if it is still unfinished and append its ``terminal`` event(s). Returns the stored
        ``(events, frames)``, or None when the run had already ended (nothing written: never a
        second terminal event). KeyError for an unknown run."""
    def terminal_event(self, run_id: str) -> Event | None:
        """The stored terminal event of ``run_id`` (the first, there is only one), or None."""
    def call_intent(self, run_id: str, call_id: str, tool: str, arguments: dict[str, Any]) -> None:
        """Record that ``call_id`` is about to execute (written before the tool runs)."""
    def call_outcome(self, run_id: str, call_id: str, outcome: dict[str, Any]) -> None:
        """Record the outcome of a call whose intent was recorded (KeyError otherwise)."""
    def unfinished_runs(self) -> list[str]:
        """Ids of runs without a terminal state, oldest first."""
    def calls_without_outcome(self, run_id: str) -> list[dict[str, Any]]:
        """Calls of ``run_id`` with an intent and no outcome, in intent order."""
    def list_runs(self, *, origin: str | None = None, limit: int = 100,
                  origin_prefix: str | None = None) -> list[dict[str, Any]]:
        """Newest runs first (without calls): ``{run_id, origin, conversation, state, started_at,
        finished_at, meta}``; ``origin_prefix``: only runs whose origin starts with it (in the store, before
        the limit)."""
    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """One run as in :meth:`list_runs` plus ``calls`` (intent order, each with ``outcome`` or
        None), or None."""
    def runs_to_recover(self, live: set[str] | None = None) -> list[dict[str, Any]]:
        """Unfinished runs whose owner is dead (not in ``live``; default :meth:`live_owners`), oldest
        first, each with ``owner``. A run without an owner is dead."""
    def running_elsewhere(self, conversation: str) -> bool:
        """True when another live broker has an unfinished run in ``conversation``."""
    def pending_permissions(self, *, run_id: str | None = None, live: set[str] | None = None
                            ) -> list[dict[str, Any]]:
        """Permission requests waiting for an answer (``{request_id, owner, origin, run_id,
        event_id, created_at}``, event order), kept in step with the ``permission.request`` /
        ``permission.resolved`` / ``permission.timeout`` events in their own transaction. With
        ``live``: only those of dead owners."""
    def mark_interrupted(self) -> list[str]:
        """Every unfinished run becomes ``interrupted`` (no events). Returns their ids."""


@runtime_checkable
class ConversationStore(Protocol):
    """Conversations: the normalized message list of a ``%%agent`` conversation and its metadata.
    Stored append-only (a message is written once), so a turn costs what it adds, not the history."""

    def load_conversation(self, conv_id: str) -> dict[str, Any] | None:
        """``{conv_id, origin, name, messages, meta, created_at, updated_at}`` or None."""
    def conversation_origin(self, conv_id: str) -> str | None:
        """The origin of a stored conversation (None: there is none), without loading its messages."""
    def save_conversation(self, conv_id: str, origin: str, name: str, messages: list[dict[str, Any]],
                          meta: dict[str, Any]) -> None:
        """Insert or replace the whole conversation (a fork, a migration); ``created_at`` is kept."""
    def append_messages(self, conv_id: str, origin: str, name: str, start: int,
                        messages: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        """Store ``messages`` as the conversation's messages ``start, start + 1, …`` (creating the
        conversation when ``start`` is 0): messages from ``start`` on that were stored before are
        replaced, those before ``start`` are kept as they are. Idempotent: the same call twice
        leaves the same state. ValueError when ``start`` is beyond the stored message count."""
    def delete_conversation(self, conv_id: str) -> bool:
        """Remove a conversation; True if it existed. Its runs stay in the journal."""
    def list_conversations(self, origin: str | None = None) -> list[dict[str, Any]]:
        """Summaries (``message_count`` instead of messages), most recently updated first."""


@runtime_checkable
class TrustStore(Protocol):
    """Saved trust ("Always allow for this notebook"), bound to a tool digest.

    Keyed by ``(origin, server, tool)`` as three separate values (``ToolSpec.key``: ``server`` is ``""``
    for relay's own tools), never a joined ``server__tool``: two servers whose joined names meet never
    share a row (docs/mcp.md, "Classification and pins")."""

    def add_trust(self, origin: str, server: str, tool: str, digest: str) -> None:
        """Trust ``(server, tool)`` for ``origin`` while its digest is ``digest`` (replaces an older digest)."""
    def has_trust(self, origin: str, server: str, tool: str, digest: str) -> bool:
        """True only for exactly this key and digest (a changed tool is not trusted)."""
    def list_trust(self, origin: str | None = None) -> list[dict[str, Any]]:
        """``[{origin, server, tool, digest, created_at}]`` ordered by origin, server, tool."""
    def revoke_trust(self, origin: str, *, server: str | None = None, tool: str | None = None) -> int:
        """Forget the trust of ``origin``: every tool (both None), every tool of ``server`` (tool None),
        or ``(server, tool)``; ``tool`` without ``server`` is a ValueError. Returns how many went."""


@runtime_checkable
class PinStore(Protocol):
    """Classification pins of MCP tools, bound to the tool's digest (mcp/pins.py), keyed by
    ``(server, tool)`` as two separate values (the server's own tool name, not ``server__tool``)."""

    def put_pin(self, server: str, tool: str, digest: str, tool_class: ToolClass | str) -> None:
        """Pin ``(server, tool)`` to ``tool_class`` at ``digest`` (replaces). ValueError for an unknown class."""
    def get_pin(self, server: str, tool: str) -> tuple[str, ToolClass] | None:
        """``(digest, class)`` or None. The caller compares the digest."""
    def delete_pin(self, server: str, tool: str) -> bool:
        """Remove the pin of ``(server, tool)``; True if there was one."""
    def list_pins(self) -> list[dict[str, Any]]:
        """``[{server, tool, digest, tool_class, created_at}]`` ordered by server, tool."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint journal entry (without its pre-image bytes); see storage/checkpoints.py."""

    seq: int
    id: str
    origin: str
    conversation: str | None
    run_id: str
    target: str
    """Path relative to the Jupyter root."""
    pre_exists: bool
    pre_sha256: str | None
    post_sha256: str | None
    pending_sha256: str | None
    state: str
    note: str
    created_at: float
    updated_at: float

    def public(self) -> dict[str, Any]:
        """The receipt clients may see (no bytes, no internals beyond digests)."""
        return {
            "id": self.id, "target": self.target, "state": self.state, "run_id": self.run_id,
            "conversation": self.conversation, "created_at": self.created_at, "updated_at": self.updated_at,
            "pre_exists": self.pre_exists, "pre_sha256": self.pre_sha256, "post_sha256": self.post_sha256,
            "note": self.note,
        }


@runtime_checkable
class CheckpointStore(Protocol):
    """Every push's pre-image, staged durably before the file is touched (write-ahead):
    ``prepared → applied → reverting → reverted``. Each entry carries its owner (the lease)."""

    def get(self, checkpoint_id: str) -> Checkpoint | None:
        """One checkpoint by id."""
    def pre_image(self, checkpoint_id: str) -> bytes | None:
        """The staged pre-image (None when the target did not exist before, or after revert)."""
    def list(self, *, origin: str | None = None, limit: int = 100) -> list[Checkpoint]:
        """Newest first; only ``origin``'s when given."""
    def active(self, run_id: str, target: str) -> Checkpoint | None:
        """The run's live checkpoint for ``target`` (prepared or applied), if any."""
    def cascade(self, checkpoint_id: str) -> list[Checkpoint]:
        """The selected checkpoint and every later one of its origin not yet reverted, newest first."""
    def unfinished(self, *, all_owners: bool = False) -> list[Checkpoint]:
        """Entries between steps (prepared or reverting), oldest first; only those of dead owners
        unless ``all_owners``."""
    def owner_of(self, checkpoint_id: str) -> str | None:
        """The lease id of the broker that made it (None: unknown, or before leases)."""
    def prepare(self, *, origin: str, conversation: str | None, run_id: str, target: str,
                pre_image: bytes | None, pending_sha256: str) -> Checkpoint:
        """Stage a new checkpoint durably (on disk when this returns: fsync), state ``prepared``."""
    def prepare_again(self, checkpoint_id: str, pending_sha256: str) -> None:
        """A later push of the same run to the same target: expect a new post-image."""
    def mark_applied(self, checkpoint_id: str, post_sha256: str | None, note: str = "") -> None:
        """The push landed: ``post_sha256`` is what the live file must equal for a revert."""
    def mark_reverting(self, checkpoint_id: str) -> None:
        """About to restore the pre-image."""
    def mark_reverted(self, checkpoint_id: str, note: str = "") -> None:
        """The pre-image is back (or the push never landed); the pre-image bytes are dropped."""


@runtime_checkable
class LeaseStore(Protocol):
    """Broker leases (storage/leases.py): who owns a run, a pending permission, a checkpoint."""

    owner_id: str | None
    """This store's lease (None until :meth:`acquire_lease`); new runs and permissions carry it."""
    lease_ttl: float

    def acquire_lease(self, ttl: float = 30.0) -> str:
        """Take a lease for this process; returns the new owner id (also set as :attr:`owner_id`)."""
    def renew_lease(self) -> None:
        """Renew this store's lease (re-creating it if it was deleted as dead). Raises
        StorageUnavailable when the store cannot be written."""
    def release_lease(self) -> None:
        """Give the lease up (clean shutdown). Idempotent."""
    def leases(self) -> list[dict[str, Any]]:
        """Every lease row ``{owner_id, host, pid, proc_start, started_at, renewed_at, ttl}``."""
    def live_owners(self) -> set[str]:
        """Owner ids alive now (this store's own lease always is)."""
    def forget_dead_leases(self, live: set[str] | None = None) -> int:
        """Delete the lease rows of dead owners. Returns how many."""


class TeamLimitStore(Protocol):
    """Teams' limits set from the terminal (``jupyter relay budget set --team``, storage/team_limits.py):
    one row per team, read by every broker on the store (PostgreSQL: every user's)."""

    def team_limits(self) -> dict[str, dict[str, Any]]:
        """``{team: {tokens_per_day, cost_per_day_usd, tokens_per_month, cost_per_month_usd}}`` of every
        team whose limits were set (None: no limit on that axis)."""
    def put_team_limits(self, team: str, limits: Any, *, replace: bool = True) -> bool:
        """Store ``team``'s limits (checked as a ``core.teams.TeamBudget`` of a valid team name:
        ValueError/TypeError, nothing written). ``replace=False``: only when the team has none yet.
        True when written."""


@runtime_checkable
class Store(GrantStore, Ledger, EventStore, RunJournal, ConversationStore, TrustStore, PinStore, LeaseStore,
            TelemetryStore, TeamLimitStore, Protocol):
    """Everything the broker persists, in one object (module docstring for the common rules)."""

    storage_problem: Refusal | None
    """The last write failure (code STORAGE_FULL / STORAGE_ERROR) until a write commits again and
    there is space; readyz answers 503 and new runs and tool calls are refused meanwhile."""

    @property
    def checkpoints(self) -> CheckpointStore:
        """The checkpoint journal of this store (same connection / transactions)."""
    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
    def transaction(self) -> AbstractContextManager[object]:
        """A write transaction on this thread: every store write inside it commits together at its
        end or not at all (an exception rolls all of them back and propagates). Nested, it joins the
        outer one (a savepoint: an exception inside rolls back only the inner part). Recovery and a
        run's end use it to commit history, journal state and terminal event as one."""
    def probe_write(self) -> None:
        """A real write and a free-space check (the maintenance loop's storage probe): clears
        :attr:`storage_problem` when both succeed, raises StorageUnavailable otherwise."""
    def check_space(self) -> None:
        """Set :attr:`storage_problem` (STORAGE_FULL) when the storage has too little free space."""
    def close(self) -> None:
        """Release the store's resources. Idempotent; later calls raise StoreError."""
