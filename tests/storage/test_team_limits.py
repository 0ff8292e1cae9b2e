"""Team limits on the SQLite store (storage/team_limits.py): ``jupyter relay budget set --team`` writes the
store's table, which every broker on the data dir reads; the old ``team_budgets.json`` still overrides the
configuration for the teams the table has no row for; a malformed row is ignored (the limits that hold
without it stay, never none)."""

from __future__ import annotations

from pathlib import Path

from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.teams import Teams
from relay_jupyter.storage import Store
from relay_jupyter.storage.team_limits import TEAM_LIMITS_FILE, team_limits_source, write_team_limits

TEAMS = {"ml": {"members": ["alice"], "tokens_per_day": 100}, "ops": {"members": ["bob"], "tokens_per_day": 200},
         "qa": {"members": ["carol"], "tokens_per_day": 300}}


def _day_limits(teams: Teams) -> dict[str, int | None]:
    return {t.name: t.budget.tokens_per_day for t in teams}


def test_the_table_over_the_file_over_the_configuration(tmp_path: Path) -> None:
    write_team_limits(tmp_path / TEAM_LIMITS_FILE, {"ml": {"tokens_per_day": 7}, "ops": {"tokens_per_day": 9}})
    config = BrokerConfig.model_validate({"data_dir": str(tmp_path), "teams": TEAMS})
    with Store.open(tmp_path / "relay.db") as store, Store.open(tmp_path / "relay.db") as other:
        source = team_limits_source(Teams.from_config(TEAMS), store, config)
        assert _day_limits(source()) == {"ml": 7, "ops": 9, "qa": 300}
        other.put_team_limits("ml", {"tokens_per_day": 1500})  # another broker (or the CLI) on the data dir
        assert _day_limits(source()) == {"ml": 1500, "ops": 9, "qa": 300}
        assert store.team_limits() == other.team_limits()
        # a row that is not a team's limits (written by hand): ignored, the limits without the table hold
        with other.transaction() as conn:
            conn.execute("UPDATE team_limits SET body = '{\"tokens_per_day\": -5}' WHERE team = 'ml'")
        assert _day_limits(source()) == {"ml": 7, "ops": 9, "qa": 300}
        # a team the configuration does not have is not made up from a row
        other.put_team_limits("ghost", {"tokens_per_day": 1})
        with other.transaction() as conn:
            conn.execute("DELETE FROM team_limits WHERE team = 'ml'")
        assert _day_limits(source()) == {"ml": 7, "ops": 9, "qa": 300}


def test_an_in_memory_broker_reads_its_stores_table(tmp_path: Path) -> None:
    from relay_jupyter.core.memory import MemoryStore

    config = BrokerConfig.model_validate({"in_memory": True, "teams": TEAMS})
    store = MemoryStore()
    source = team_limits_source(Teams.from_config(TEAMS), store, config)
    store.put_team_limits("qa", {"tokens_per_day": None})
    assert _day_limits(source()) == {"ml": 100, "ops": 200, "qa": None}
