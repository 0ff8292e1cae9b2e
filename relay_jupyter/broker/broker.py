"""The Broker: the one object that holds the enforcement boundary's parts.

    broker = Broker.open(BrokerConfig())          # SQLite store + JSON-lines audit under the data dir
    broker = Broker.open(BrokerConfig(in_memory=True))   # tests, benchmarks
    body = await broker.dispatch(caller, b'{"jsonrpc":"2.0",...}')

Attributes other layers use: ``store, audit, grants (GrantBook), ledger (BudgetLedger), gate (Gate),
pricing, events (EventBus), permissions (PermissionRouter), kernel_bridge (KernelBridge), config,
metrics, telemetry (core/telemetry.Telemetry), sessions (broker/sessions.SessionBook)``; optional slots ``runs, mcp, workspace_tools, checkpoints`` start as None and are wired by
those components when they are installed (a method that needs a missing one answers UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.budgets import HOLD_TTL, BudgetLedger
from ..core.caller import Caller, CallerKind
from ..core.errors import Code, ConfigRefusal, GateRefusal
from ..core.gate import Gate
from ..core.grants import GrantBook
from ..core.memory import MemoryAuditSink, MemoryStore
from ..core.ports import AuditSink, CheckpointStore, Store
from ..core.pricing import Pricing
from ..core.telemetry import Telemetry
from .sessions import SessionBook
from ..storage.errors import StoreError
from .config import BrokerConfig
from .dispatch import dispatch
from .events import EventBus
from .kernel_bridge import KernelBridge
from .metrics import BrokerMetrics, CountingAudit
from .permissions import PermissionRouter
from .registry import METHODS

__all__ = ["Broker", "load_methods", "require", "target_origin"]

if TYPE_CHECKING:
    from ..mcp.registry import McpRegistry
    from ..runtime.manager import RunManager
    from ..workspace.tools import WorkspaceTools


log = logging.getLogger("relay_jupyter.broker")


def load_methods() -> list[str]:
    """Register every RPC method (``broker/methods/__init__.py`` imports each namespace module by name);
    return the names of the modules that register methods."""
    from . import methods

    return [m.__name__ for m in methods.MODULES]


class Broker:
    """Holds every part of the broker; see the module docstring."""

    def __init__(self, config: BrokerConfig, *, store: Store, audit: AuditSink) -> None:
        self.config = config
        self.store = store
        self.metrics = BrokerMetrics(lambda: set(METHODS))
        self.audit = CountingAudit(audit, self.metrics)
        self.pricing = Pricing(config.pricing or None)
        self.grants = GrantBook(store, policy=_admin_policy(config))
        # a hold outlives the longest model turn (then it is a crashed broker's: charged in full, docs/gate.md §6)
        self.ledger = BudgetLedger(store, hold_ttl=max(HOLD_TTL, 2 * config.turn_timeout + 60),
                                   **_team_budgets(config, store))
        self.gate = Gate(grants=self.grants, ledger=self.ledger, audit=self.audit, pricing=self.pricing,
                         consent_timeout=config.consent_timeout)
        self.events = EventBus(store)
        self.trust = store
        self.permissions = PermissionRouter(self.events, trust=store, timeout=config.consent_timeout)
        self.events.run_end_hooks.append(self.permissions.forget_run)
        self.kernel_bridge = KernelBridge(self.events, timeout=config.kernel_tool_timeout)
        # one row per model request of the endpoints and of runs (core/telemetry.py, docs/telemetry.md)
        self.telemetry = Telemetry(store, observers=[self.metrics.observe_request])
        # the endpoints' sessions and lineage (broker/sessions.py, core/lineage.py), kept in the store too
        self.sessions = SessionBook(store=store)
        # wired later by their components
        self.runs: RunManager | None = None
        self.mcp: McpRegistry | None = None
        self.workspace_tools: WorkspaceTools | None = None
        self.checkpoints: CheckpointStore | None = None
        """Optional ``async (caller, origin, conversation, tool, arguments) -> {content, is_error}``: the
        runtime executor's client-call entry; ``tools.call`` uses it when set."""
        self.ready = True
        self._maintenance: asyncio.Task[None] | None = None
        self._pruning: asyncio.Future[int] | None = None
        self.metrics.live(self._live_gauges)
        load_methods()

    @classmethod
    def open(cls, config: BrokerConfig) -> Broker:
        """Build a broker with durable storage (or in-memory ports when ``config.in_memory``)."""
        if config.in_memory:
            # a lease here too: a run stored with no owner reads as a dead broker's, and the maintenance
            # step's recovery interrupted live runs mid-answer (tests/runtime/test_live_runs_survive_storage_check.py)
            memory = MemoryStore()
            memory.acquire_lease(config.lease_ttl)
            return cls(config, store=memory, audit=MemoryAuditSink())
        from ..storage.audit_log import AuditLog
        from ..storage.paths import data_dir, ensure_private_dir
        from ..storage.sqlite import Store

        root = ensure_private_dir(Path(config.data_dir)) if config.data_dir else data_dir()
        if config.secrets_file is not None:
            from .config import check_private_file

            check_private_file(Path(config.secrets_file))
        if config.store_url:  # a PostgreSQL store shared by several brokers (docs/multi-user.md)
            from ..storage.postgres import PgAuditMirror, PostgresStore

            from ..core.teams import default_user

            # each user's own schema (grants, runs, conversations...); teams' rows and the audit copy shared
            store = PostgresStore.open(config.store_url, password_file=config.store_password_file,
                                       secrets_file=config.secrets_file, namespace=config.user or default_user())
        else:
            store = Store.open(root / "relay.db")
        try:
            audit = AuditLog(root / config.audit_file)
            if config.store_url:  # the JSON-lines file stays the local copy; the database's is the team's
                audit = PgAuditMirror(audit, store)  # type: ignore[arg-type]
        except BaseException:
            store.close()
            raise
        try:
            # this broker's lease: runs, pending permissions and checkpoints it makes carry it, and
            # another broker on the same data dir leaves them alone while it lives (storage/leases.py)
            store.acquire_lease(config.lease_ttl)
        except StoreError as exc:  # a full disk at start: serve not-ready until the store is writable
            log.error("relay: cannot record this broker's lease: %s", exc.message)
        return cls(config, store=store, audit=audit)

    async def dispatch(self, caller: Caller, body: bytes) -> bytes | None:
        """Answer one JSON-RPC body for ``caller`` (see :mod:`relay_jupyter.broker.dispatch`)."""
        self.events.follow(caller)  # a renamed notebook's kernel: its event streams follow its new origin
        return await dispatch(self, caller, body)

    def prune_events(self) -> int:
        """Apply event retention (age and count). Called on the event loop (the server's hourly
        timer), the pruning runs in a worker thread, page by page (storage/events.py), so the loop
        never waits for it: returns 0 then. Elsewhere it prunes now and returns how many went."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._prune()
        if self._pruning is None or self._pruning.done():
            self._pruning = loop.run_in_executor(None, self._prune)
        return 0

    def _prune(self) -> int:
        try:  # telemetry rows: by age only (docs/telemetry.md); a failure waits for the next round
            self.store.prune_telemetry(self.telemetry.now() - self.config.telemetry_retention_seconds)
        except StoreError as exc:
            log.warning("relay: telemetry retention failed: %s", exc.message)
        try:
            return self.store.prune_events(self.config.event_retention_seconds, self.config.event_retention_count)
        except StoreError as exc:  # a full disk: retention waits for the next round
            log.warning("relay: event retention failed: %s", exc.message)
            return 0

    # -- storage health and the lease (docs/storage.md) ---------------------------------------------

    def storage_problem(self) -> Any:
        """The store's last write failure (a StorageUnavailable with code and message) while it
        lasts, else None. readyz answers 503 and new runs and tool calls are refused meanwhile."""
        return self.store.storage_problem

    def check_storage(self) -> None:
        """One maintenance step: renew the lease (also the write probe that tells a full disk has
        space again), then record what failed to be stored (runs that ended meanwhile), and recover
        the runs and permission requests of brokers that died meanwhile. Never raises."""
        try:
            self.store.probe_write()
        except StoreError:
            return
        if self.storage_problem() is not None:
            return
        try:
            if self.runs is not None:
                self.runs.repair()
                if self.store.runs_to_recover() or self.store.pending_permissions(live=self.store.live_owners()):
                    self.runs.recover()
            self.store.charge_dead_holds()  # a dead broker's budget holds: charged now, not at expiry
            self.store.forget_dead_leases()
        except StoreError as exc:
            log.warning("relay: storage maintenance failed: %s", exc.message)
        except Exception:
            log.exception("relay: storage maintenance failed")

    def start_maintenance(self) -> None:
        """Start the background lease renewal and storage check (on the running event loop), and
        apply event retention once now (in a worker thread), not only an hour after start."""
        if self._maintenance is not None:
            return
        self._maintenance = asyncio.ensure_future(self._maintain())
        self.prune_events()

    async def _maintain(self) -> None:
        from ..runtime.offload import off_loop

        ttl = float(self.store.lease_ttl or self.config.lease_ttl)
        while True:
            problem = self.storage_problem() is not None
            await asyncio.sleep(self.config.storage_check_interval if problem else ttl / 3)
            # check_storage's store calls on a store thread (runtime/offload.py: a database that is locked or
            # down stalls this step, not the broker); recovery, which emits events, on the loop
            try:
                if await off_loop(self._probe_and_repair):
                    self.runs.recover()
                await off_loop(self._charge_dead)
            except Exception:
                log.exception("relay: storage maintenance failed")

    def _probe_and_repair(self) -> bool:
        """The first half of :meth:`check_storage`: True when runs or permission requests of a dead broker
        wait for recovery."""
        try:
            self.store.probe_write()
        except StoreError:
            return False
        if self.storage_problem() is not None or self.runs is None:
            return False
        try:
            self.runs.repair()
            return bool(self.store.runs_to_recover() or self.store.pending_permissions(live=self.store.live_owners()))
        except StoreError as exc:
            log.warning("relay: storage maintenance failed: %s", exc.message)
            return False

    def _charge_dead(self) -> None:
        """The second half of :meth:`check_storage`: a dead broker's holds charged, its lease forgotten."""
        if self.storage_problem() is not None:
            return
        try:
            self.store.charge_dead_holds()
            self.store.forget_dead_leases()
        except StoreError as exc:
            log.warning("relay: storage maintenance failed: %s", exc.message)

    def _live_gauges(self) -> dict[str, float]:
        active = len(self.events.active_runs)
        if self.runs is not None:
            try:
                active = len(self.runs.active_runs())
            except Exception:  # a metric must never break a scrape
                log.debug("active_runs failed", exc_info=True)
        return {
            "relay_active_runs": active,
            "relay_event_lag_events": self.events.max_lag(),
            "relay_sse_subscribers": self.events.subscribers,
            "relay_last_event_id": self.events.last_event_id(),
            "relay_pending_permissions": len(self.permissions._pending),
        }

    def close(self) -> None:
        """Deny pending permission requests and close the store and audit log."""
        self.ready = False
        if self._maintenance is not None:
            self._maintenance.cancel()
            self._maintenance = None
        try:
            self.permissions.deny_all(answered_by="shutdown")
        except StoreError as exc:  # a full disk: recovery withdraws them at the next start
            log.warning("relay: could not record the shutdown's answers to pending requests: %s", exc.message)
        try:
            self.store.release_lease()
        except Exception as exc:  # a full disk: the lease then expires, or its pid is seen dead
            log.warning("relay: could not release the broker's lease: %s", exc)
        self.sessions.close()  # its queued history writes land before the store closes
        self.audit.close()
        self.store.close()


def _admin_policy(config: BrokerConfig) -> Any:
    """The admin policy every grant is narrowed by (core/admin_policy.py), or None."""
    if not config.admin_policy:
        return None
    from ..core.admin_policy import AdminPolicy

    return AdminPolicy.from_config(config.admin_policy)


def _team_budgets(config: BrokerConfig, store: Store) -> dict[str, object]:
    """The team options of the broker's BudgetLedger (core/teams.py): none when no team is configured."""
    if not config.teams:
        return {}
    from ..core.teams import Teams, default_user, teams_for_origin

    from ..storage.team_limits import team_limits_source

    # limits set from the terminal (jupyter relay budget set --team) live in the store, over the config's
    teams = team_limits_source(Teams.from_config(config.teams), store, config)
    return {"teams_for": teams_for_origin(teams, config.user or default_user()),
            "transaction": store.transaction}


def require(component: Any, what: str) -> Any:
    """Return ``component`` or refuse with UNAVAILABLE naming ``what``."""
    if component is None:
        raise ConfigRefusal(Code.UNAVAILABLE, f"{what} is not available in this relay server")
    return component


def target_origin(caller: Caller, requested: str | None) -> str:
    """The origin a control method acts on.

    A browser session must name one (it acts for every origin of its server); a kernel or daemon
    client acts for its own origin, and naming any other is refused.

    Raises:
        GateRefusal: UNAUTHORIZED.
    """
    if caller.kind is CallerKind.BROWSER:
        if not requested:
            raise GateRefusal(Code.UNAUTHORIZED, "name the origin (notebook) to act on")
        return requested
    if caller.kind is CallerKind.PANEL:  # a hub user's panel: one of its user's origins, never another user's
        if not requested:
            raise GateRefusal(Code.UNAUTHORIZED, "name the origin (notebook) to act on")
        if not caller.acts_for(requested):
            raise GateRefusal(Code.UNAUTHORIZED, "a user's side panel may only act on that user's notebooks")
        return requested
    if caller.origin is None:
        raise GateRefusal(Code.UNAUTHORIZED, "this client has no origin")
    if requested is not None and requested != caller.origin:
        raise GateRefusal(Code.UNAUTHORIZED, "a notebook may only act on its own grants, runs and trust")
    return caller.origin
