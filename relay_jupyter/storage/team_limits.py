"""Team limits set from the terminal (``jupyter relay budget set --team``), kept in the broker's store.

``jupyter relay budget set --team`` writes a team's limits to the store's ``team_limits`` table
(``Store.put_team_limits``): on PostgreSQL one table for every user's broker (``relay_shared``), so
per-user brokers sharing the database (docs/multi-user.md, deployment 2) never disagree about a team's
limits. They replace the limits of the same team in ``c.RelayApp.teams`` (its members stay the
configured ones); a running broker reads the table at each reservation (:class:`TeamLimitsSource`), so a
new limit holds from the next request on.

``<data dir>/team_budgets.json`` (mode 0600, written atomically; ``{"ml": {"tokens_per_day": 2000000,
"cost_per_day_usd": 40, ...}}``), where the limits lived before, stays: on SQLite it overrides the
configuration for the teams the table has no row for (one stat per look, :class:`TeamLimitsFile`); on
PostgreSQL it seeds the table for those teams when the broker opens (:func:`seed_team_limits`) and is
not read after, so a broker's own file can never make it disagree with the others. A file or a table
row that is unreadable or malformed is logged and ignored: the configured limits hold (never none).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..core.memory import check_team_limits
from ..core.teams import TEAM_PREFIX, Teams
from ._db import dumps
from .atomic import atomic_write_json
from .dialect import SqlStore
from .errors import StoreError

__all__ = ["TEAM_LIMITS_FILE", "TeamLimitsFile", "TeamLimitsMixin", "TeamLimitsSource", "read_team_limits", "seed_team_limits",
           "write_team_limits"]

TEAM_LIMITS_FILE = "team_budgets.json"
log = logging.getLogger(__name__)


class TeamLimitsMixin(SqlStore):
    """``TeamLimitStore`` of both SQL stores: the ``team_limits`` table (on a namespaced PostgreSQL store,
    the shared schema's, as the teams' ledger rows)."""

    def team_limits(self) -> dict[str, dict[str, Any]]:
        """``{team: limits}`` of every team whose limits were set (``TeamBudget.model_dump()`` each)."""
        rows = self.query(f"SELECT team, body FROM {self._ls(TEAM_PREFIX)}team_limits ORDER BY team")
        return {team: json.loads(body) for team, body in rows}

    def put_team_limits(self, team: str, limits: Any, *, replace: bool = True) -> bool:
        """Store ``team``'s limits (ValueError/TypeError and nothing written when they are not a team's
        limits); ``replace=False`` writes only when the team has none yet. True when written."""
        body = dumps(check_team_limits(team, limits))
        conflict = "DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at" if replace else "DO NOTHING"
        with self.transaction() as conn:
            return conn.execute(self.sql(f"INSERT INTO {self._ls(TEAM_PREFIX)}team_limits (team, body, updated_at) "
                                         f"VALUES (?, ?, ?) ON CONFLICT (team) {conflict}"),
                                (team, body, self.now())).rowcount > 0


def read_team_limits(path: Path) -> dict[str, dict[str, Any]]:
    """The limits in ``path`` (``{}`` when there is no file).

    Raises:
        ValueError: the file is not a JSON object of objects.
    """
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    data = json.loads(raw)
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path} must hold a JSON object of {{team: {{limits}}}}")
    return data


def write_team_limits(path: Path, limits: dict[str, dict[str, Any]]) -> None:
    """Replace the file with ``limits`` (atomic, 0600)."""
    atomic_write_json(path, limits, mode=0o600)


class TeamLimitsFile:
    """The configured teams with the file's limits over them, re-read when the file changes."""

    def __init__(self, base: Teams, path: Path) -> None:
        self.base = base
        self.path = Path(path)
        self._sig: tuple[int, int, int] | None = None
        self._teams = base

    def teams(self) -> Teams:
        """The teams now in force."""
        try:
            st = os.stat(self.path)
            sig: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            sig = None
        if sig != self._sig:
            self._sig = sig
            try:
                self._teams = self.base.with_limits(read_team_limits(self.path)) if sig is not None else self.base
            except (OSError, ValueError) as exc:
                log.error("relay: ignoring %s (%s); the configured team limits hold", self.path, exc)
                self._teams = self.base
        return self._teams


class TeamLimitsSource:
    """The teams now in force for a broker: the configured ``base``, the store's ``team_limits`` rows over
    them, and (``file``: SQLite) the limits file for the teams the table has no row for."""

    def __init__(self, base: Teams, store: Any, file: Path | None = None) -> None:
        self.base = base
        self.store = store
        self.file = TeamLimitsFile(base, file) if file is not None else None
        self._bad: str | None = None

    def teams(self) -> Teams:
        """The teams now in force (one read of the store's small table)."""
        seeded = self.file.teams() if self.file is not None else self.base
        rows = self.store.team_limits()
        try:
            teams = seeded.with_limits(rows)
        except ValueError as exc:  # a row no broker wrote (budget set validates): keep what holds without it
            if str(exc) != self._bad:
                self._bad = str(exc)
                log.error("relay: ignoring the stored team limits (%s); the configured team limits hold", exc)
            return seeded
        self._bad = None
        return teams


def seed_team_limits(store: Any, path: Path) -> int:
    """Copy the limits file's teams that the store's table does not have yet into it (a broker on a
    shared store, at open: limits set before they were kept in the store carry over, the first broker's
    file wins). Returns how many teams were copied; an unreadable file is logged and copies nothing."""
    try:
        limits = read_team_limits(path)
    except (OSError, ValueError) as exc:
        log.error("relay: ignoring %s (%s); the stored team limits hold", path, exc)
        return 0
    if not limits:
        return 0
    copied = 0
    try:
        have = store.team_limits()
        for team, body in limits.items():
            if team in have:
                continue
            try:
                copied += bool(store.put_team_limits(team, body, replace=False))
            except (TypeError, ValueError) as exc:
                log.error("relay: not copying team %r of %s to the store (%s)", team, path, exc)
    except StoreError as exc:
        log.error("relay: could not copy %s to the store (%s); its limits are not in force", path, exc.message)
    return copied


def team_limits_source(base: Teams, store: Any, config: Any) -> Any:
    """``() -> Teams`` in force for a broker with ``config`` (a ``BrokerConfig``) on ``store``: the
    store's limits over ``base``; on SQLite the data dir's limits file under them, on PostgreSQL the
    file only seeds the table (module docstring). An in-memory broker has its store's table alone."""
    if config.in_memory:
        return TeamLimitsSource(base, store).teams
    from .paths import data_dir

    root = Path(config.data_dir) if config.data_dir else data_dir()
    if config.store_url:
        seed_team_limits(store, root / TEAM_LIMITS_FILE)
        return TeamLimitsSource(base, store).teams
    return TeamLimitsSource(base, store, root / TEAM_LIMITS_FILE).teams
