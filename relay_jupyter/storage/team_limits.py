"""Team limits set from the terminal (``jupyter relay budget set --team``), kept beside the broker's store.

``<data dir>/team_budgets.json`` (mode 0600, written atomically) maps a team name to its limits
(``{"ml": {"tokens_per_day": 2000000, "cost_per_day_usd": 40, ...}}``). They replace the limits of the same
team in ``c.RelayApp.teams`` (its members stay the configured ones); a running broker re-reads the file when
it changes (one ``stat`` per look, :class:`TeamLimitsFile`), so a new limit holds from the next request on.
A file that is unreadable or malformed is logged and ignored: the configured limits hold (never none).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..core.teams import Teams
from .atomic import atomic_write_json

__all__ = ["TEAM_LIMITS_FILE", "TeamLimitsFile", "read_team_limits", "write_team_limits"]

TEAM_LIMITS_FILE = "team_budgets.json"
log = logging.getLogger(__name__)


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
