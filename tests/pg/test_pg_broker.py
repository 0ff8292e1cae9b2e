"""A broker opened on ``store_url`` (PostgreSQL): its store, lease, checkpoints and audit copy live in
the shared database, and two brokers of two users (per-user brokers sharing one database) draw from
one team budget: alice's spend is bob's remaining."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay_jupyter.core.errors import Code, ConfigRefusal, GateRefusal
from relay_jupyter.core.types import AuditRecord, Budget, Grant

pytestmark = pytest.mark.pg

pytest.importorskip("psycopg", reason="psycopg is not installed")

from relay_jupyter.broker.assembly import install_components  # noqa: E402
from relay_jupyter.broker.broker import Broker  # noqa: E402
from relay_jupyter.broker.config import BrokerConfig  # noqa: E402
from relay_jupyter.storage.postgres import PostgresStore  # noqa: E402

TEAMS = {"ml": {"members": ["alice", "bob"], "tokens_per_day": 1000}}


def _config(url: str, password_file: Path, data_dir: Path, user: str) -> BrokerConfig:
    return BrokerConfig(store_url=url, store_password_file=password_file, data_dir=data_dir, teams=TEAMS,
                        user=user)


def _grant(origin: str) -> Grant:
    return Grant(origin=origin, consent_id="c", models=frozenset({"*"}),
                 budget=Budget(requests_per_minute=None, tokens_per_day=100_000, cost_per_day_usd=None))


def test_a_broker_on_store_url_keeps_everything_in_the_database(postgres_db, tmp_path: Path) -> None:
    url, pw = postgres_db
    broker = Broker.open(_config(url, pw, tmp_path / "relay", "alice"))
    try:
        assert isinstance(broker.store, PostgresStore)
        assert broker.store.owner_id in {row["owner_id"] for row in broker.store.leases()}
        install_components(broker, jupyter_root=tmp_path)
        assert broker.checkpoints is broker.store.checkpoints
        assert not (tmp_path / "relay" / "relay.db").exists()  # no SQLite file beside the database
        record = broker.audit.append(AuditRecord(ts=1.0, origin="notebook:a.ipynb", tool="t", decision="deny"))
        assert broker.store.audit_records() == [record]
        assert (tmp_path / "relay" / "audit.jsonl").read_text().count('"decision":"deny"') == 1
    finally:
        broker.close()
    with PostgresStore.open(url, password_file=pw) as store:
        assert store.leases() == []  # released on close


def test_two_users_brokers_share_a_team_budget(postgres_db, tmp_path: Path) -> None:
    url, pw = postgres_db
    alice = Broker.open(_config(url, pw, tmp_path / "a", "alice"))
    bob = Broker.open(_config(url, pw, tmp_path / "b", "bob"))
    try:
        nb = "notebook:analysis.ipynb"  # each user's own notebook of that name
        r = alice.ledger.reserve(nb, _grant(nb), tokens=700, cost_usd=0.0)
        with pytest.raises(GateRefusal) as refused:  # bob's broker sees alice's request in flight
            bob.ledger.reserve(nb, _grant(nb), tokens=400, cost_usd=0.0)
        assert refused.value.data["team"] == "ml"
        r.settle(650, 0.0)
        [team] = bob.ledger.usage(nb, _grant(nb))["teams"]
        assert team["team"] == "ml" and team["day"]["tokens"] == 650 and team["remaining_tokens"] == 350
        bob.ledger.reserve(nb, _grant(nb), tokens=350, cost_usd=0.0).settle(350, 0.0)
        assert alice.ledger.usage(nb, _grant(nb))["teams"][0]["remaining_tokens"] == 0
    finally:
        alice.close()
        bob.close()


def test_bad_store_settings_stop_the_broker_in_one_line(postgres_db, tmp_path: Path) -> None:
    url, pw = postgres_db
    with pytest.raises(ConfigRefusal) as refused:
        BrokerConfig(store_url=url.replace("relay@", "relay:hunter2@"))
    assert refused.value.code == Code.CONFIG_INVALID and "hunter2" not in refused.value.message
    with pytest.raises(ConfigRefusal) as refused:
        BrokerConfig(teams={"ml": {"members": ["a"], "tokens_per_fortnight": 1}})
    assert "c.RelayApp.teams" in refused.value.message and "tokens_per_fortnight" in refused.value.message
    loose = tmp_path / "pw"
    loose.write_text(pw.read_text())
    loose.chmod(0o640)
    from relay_jupyter.storage.errors import StoreError

    with pytest.raises(StoreError) as refused:
        Broker.open(BrokerConfig(store_url=url, store_password_file=loose, data_dir=tmp_path / "r"))
    assert "chmod 600" in refused.value.message and pw.read_text().strip() not in refused.value.message
