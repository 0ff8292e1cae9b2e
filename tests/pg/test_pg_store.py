"""The PostgreSQL store's own promises (the contract shared with SQLite is tests/pg/test_pg_contract.py):
the password never in a URL or a message, versioned migrations, transactions that nest, event ids
committed in order under concurrent appends, checkpoints and the audit copy in the database, and a
database that goes away answered with STORAGE_ERROR."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from relay_jupyter.core.errors import Code
from relay_jupyter.core.types import AuditRecord, Grant
from relay_jupyter.testing.postgres import PostgresCluster

pytestmark = pytest.mark.pg

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")

from relay_jupyter.storage.audit_log import AuditLog  # noqa: E402
from relay_jupyter.storage.errors import SchemaError, StorageUnavailable, StoreError  # noqa: E402
from relay_jupyter.storage.pg_schema import PG_SCHEMA_VERSION  # noqa: E402
from relay_jupyter.storage.postgres import PgAuditMirror, PostgresStore, read_password  # noqa: E402


def _grant(origin: str) -> Grant:
    return Grant(origin=origin, consent_id="c", created_at=1.0)


@pytest.fixture
def pg(postgres_db: tuple[str, Path]):
    url, password_file = postgres_db
    store = PostgresStore.open(url, password_file=password_file)
    yield store
    store.close()


def test_password_is_never_in_the_url_nor_in_a_message(postgres_db: tuple[str, Path], tmp_path: Path) -> None:
    url, password_file = postgres_db
    password = password_file.read_text().strip()
    with_password = url.replace("relay@", f"relay:{password}@")
    with pytest.raises(StoreError) as refused:
        PostgresStore.open(with_password)
    assert password not in refused.value.message and "store_password_file" in refused.value.message
    # a key=value conninfo with a password is refused too
    with pytest.raises(StoreError) as refused:
        PostgresStore.open(url + f"?password={password}")
    assert password not in refused.value.message
    # a wrong password: the message names the database, not the password tried
    with pytest.raises(StoreError) as refused:
        PostgresStore.open(url, password="not-" + password)
    assert "password authentication failed" in refused.value.message and password not in refused.value.message
    # the password file must be private
    loose = tmp_path / "loose.password"
    loose.write_text(password + "\n")
    loose.chmod(0o644)
    with pytest.raises(StoreError) as refused:
        PostgresStore.open(url, password_file=loose)
    assert "chmod 600" in refused.value.message and password not in refused.value.message
    # ... and hold only the password
    two = tmp_path / "two.password"
    two.write_text(password + "\nsecond line\n")
    two.chmod(0o600)
    with pytest.raises(StoreError):
        read_password(two)
    # the secrets file's store_password entry works
    secrets_file = tmp_path / "secrets.json"
    secrets_file.write_text(json.dumps({"anthropic": "sk-x", "store_password": password}))
    secrets_file.chmod(0o600)
    store = PostgresStore.open(url, secrets_file=secrets_file)
    try:
        assert password not in store.path and store.path.startswith("postgresql://relay@127.0.0.1:")
        store.put_grant(_grant("notebook:a.ipynb"))
        assert store.get_grant("notebook:a.ipynb") is not None
    finally:
        store.close()


def test_schema_is_versioned_and_a_newer_database_is_refused(postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.create_database()
    pw = postgres_cluster.password_file
    # several brokers opening a fresh database at once migrate it once
    opened: list[PostgresStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(PostgresStore.open(url, password_file=pw, min_size=1, max_size=1))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(opened) == 4
    assert opened[0].query("SELECT version FROM relay_schema") == [(PG_SCHEMA_VERSION,)]
    opened[0].add_usage("o", "2026-12-01", 1, 0.0)
    for s in opened:
        assert s.usage("o", "2026-12-01") == (1, 0.0)
        s.close()
    with psycopg.connect(url, password=pw.read_text().strip(), autocommit=True) as conn:
        conn.execute("UPDATE relay_schema SET version = %s", (PG_SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaError) as refused:
        PostgresStore.open(url, password_file=pw)
    assert "newer relay-jupyter" in refused.value.message


def test_data_survives_reopen_and_event_ids_are_never_reused(postgres_db: tuple[str, Path]) -> None:
    url, pw = postgres_db
    store = PostgresStore.open(url, password_file=pw)
    store.put_grant(_grant("notebook:a.ipynb"))
    events = store.append_events([("x", {"n": n}, None, None) for n in range(3)])
    assert [e.id for e in events] == [1, 2, 3]
    assert store.prune_events(max_count=0) == 3
    store.close()
    with pytest.raises(StoreError):
        store.get_grant("notebook:a.ipynb")  # a closed store refuses
    store = PostgresStore.open(url, password_file=pw)
    try:
        assert store.get_grant("notebook:a.ipynb") == _grant("notebook:a.ipynb")
        assert store.last_event_id() == 3 and store.first_event_id() == 4
        assert store.append_event("y", {}).id == 4
    finally:
        store.close()


def test_nested_transactions_commit_together_or_not_at_all(pg: PostgresStore) -> None:
    with pytest.raises(RuntimeError), pg.transaction():
        pg.put_grant(_grant("notebook:a.ipynb"))
        pg.append_event("x", {})
        raise RuntimeError("boom")
    assert pg.get_grant("notebook:a.ipynb") is None and pg.last_event_id() == 0
    with pg.transaction():
        pg.put_grant(_grant("notebook:a.ipynb"))
        with pytest.raises(KeyError), pg.transaction():  # a savepoint: only the inner part goes
            pg.add_trust("notebook:a.ipynb", "", "t", "d")
            pg.run_finished("no-such-run", "done")
    assert pg.get_grant("notebook:a.ipynb") is not None and pg.list_trust() == []
    # another connection sees nothing of an open transaction until it commits
    seen: list[object] = []
    with pg.transaction():
        pg.put_grant(_grant("notebook:b.ipynb"))
        t = threading.Thread(target=lambda: seen.append(pg.get_grant("notebook:b.ipynb")))
        t.start()
        t.join()
    assert seen == [None] and pg.get_grant("notebook:b.ipynb") is not None


def test_event_ids_are_committed_in_order_under_concurrent_appends(pg: PostgresStore) -> None:
    """A follower paging with ``since = last`` while four writers append never skips an event (ids
    are taken under the counter's row lock and committed in id order)."""
    writers, batches = 4, 60
    done = threading.Event()

    def write(w: int) -> None:
        for b in range(batches):
            pg.append_events([("x", {"w": w, "b": b}, None, None)] * (1 + b % 3))

    seen: list[int] = []

    def follow() -> None:
        since = 0
        while True:
            finished = done.is_set()
            for event in pg.events_since(since):
                seen.append(event.id)
                since = event.id
            if finished:
                return

    follower = threading.Thread(target=follow)
    follower.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    follower.join()
    total = writers * sum(1 + b % 3 for b in range(batches))
    assert pg.last_event_id() == total
    assert seen == list(range(1, total + 1))


def test_checkpoints_live_in_the_database(pg: PostgresStore) -> None:
    pg.acquire_lease()
    journal = pg.checkpoints
    cp = journal.prepare(origin="notebook:a.ipynb", conversation=None, run_id="r1", target="a.txt",
                         pre_image=b"before\x00bytes", pending_sha256="p1")
    assert cp.state == "prepared" and journal.owner_of(cp.id) == pg.owner_id
    assert journal.pre_image(cp.id) == b"before\x00bytes"
    assert journal.unfinished() == []  # its owner (this store) is alive
    assert [c.id for c in journal.unfinished(all_owners=True)] == [cp.id]
    journal.mark_applied(cp.id, "post1", "ok")
    assert journal.active("r1", "a.txt").post_sha256 == "post1"  # type: ignore[union-attr]
    journal.mark_reverting(cp.id)
    journal.mark_reverted(cp.id, "undone")
    got = journal.get(cp.id)
    assert got is not None and got.state == "reverted" and journal.pre_image(cp.id) is None
    with pytest.raises(psycopg.errors.CheckViolation):
        with pg.transaction() as conn:
            conn.execute("UPDATE checkpoints SET state = 'trusted' WHERE id = %s", (cp.id,))


def test_audit_records_are_copied_to_the_database(pg: PostgresStore, tmp_path: Path) -> None:
    pg.acquire_lease()
    audit = PgAuditMirror(AuditLog(tmp_path / "audit.jsonl"), pg)
    try:
        records = [audit.append(AuditRecord(ts=1000.0 + n, origin=f"user:{u}/notebook:a.ipynb", tool="read_file",
                                            decision="allow", arguments={"path": "a.txt"}))
                   for n, u in enumerate(["alice", "bob", "alice"])]
        assert [r.seq for r in records] == [1, 2, 3]
        assert pg.audit_records() == records
        assert pg.audit_records(origin_prefix="user:alice/") == [records[0], records[2]]
        assert pg.audit_records(since=1001.0, limit=1) == [records[2]]
        assert audit.tail(10) == records  # the local log answers tail
        # the database copy failing never loses the local, tamper-evident record
        pg.close()
        kept = audit.append(AuditRecord(ts=2000.0, origin="o", tool="t", decision="deny"))
        assert kept.seq == 4 and audit.tail(1) == [kept]
    finally:
        audit.close()


def test_a_database_that_goes_away_is_storage_error() -> None:
    cluster = PostgresCluster().start()
    try:
        store = PostgresStore.open(cluster.url, password_file=cluster.password_file)
        store.put_grant(_grant("notebook:a.ipynb"))
        cluster.stop()
        with pytest.raises(StorageUnavailable) as refused:
            store.put_grant(_grant("notebook:b.ipynb"))
        assert refused.value.code == Code.STORAGE_ERROR
        assert store.storage_problem is not None and store.storage_problem.code == Code.STORAGE_ERROR
        assert cluster.url.split("@")[1].split("/")[0] in refused.value.message  # names the server
        with pytest.raises(StorageUnavailable):
            store.probe_write()
        store.close()
    finally:
        cluster.stop()


def test_a_lock_held_elsewhere_cannot_hang_a_broker(postgres_db: tuple[str, Path]) -> None:
    """Every pooled connection carries a statement timeout: a row locked by someone else for longer
    ends the write with STORAGE_ERROR instead of blocking the broker's thread."""
    url, pw = postgres_db
    store = PostgresStore.open(url, password_file=pw, statement_timeout_ms=300)
    try:
        store.add_usage("o", "2026-12-01", 1, 0.0)
        with psycopg.connect(url, password=pw.read_text().strip()) as other:
            other.execute("SELECT * FROM ledger WHERE origin = 'o' FOR UPDATE")
            with pytest.raises(StorageUnavailable) as refused:
                store.add_usage("o", "2026-12-01", 1, 0.0)
            assert refused.value.code == Code.STORAGE_ERROR
            other.rollback()
        store.add_usage("o", "2026-12-01", 1, 0.0)  # and the store goes on once the lock is gone
        assert store.usage("o", "2026-12-01") == (2, 0.0)
    finally:
        store.close()


def test_namespaces_keep_users_apart_and_share_teams_and_audit(postgres_db: tuple[str, Path], tmp_path: Path) -> None:
    """Per-user brokers on one database: alice's and bob's notebooks of the same name are different
    rows (own schemas), their teams' ledger rows, holds and the audit copy are one (relay_shared)."""
    url, pw = postgres_db
    alice = PostgresStore.open(url, password_file=pw, namespace="alice")
    bob = PostgresStore.open(url, password_file=pw, namespace="bob")
    odd = PostgresStore.open(url, password_file=pw, namespace="Bob.Smith@example.org")
    try:
        assert alice.schema == "relay_u_alice" and bob.schema == "relay_u_bob"
        assert odd.schema is not None and odd.schema.startswith("relay_u_bob_smith_example_org_")
        nb = "notebook:analysis.ipynb"
        alice.put_grant(_grant(nb))
        alice.save_conversation("c1", nb, "", [{"role": "user", "content": "alice's secret"}], {})
        alice.append_event("x", {"who": "alice"}, origin=nb)
        assert bob.get_grant(nb) is None and bob.load_conversation("c1") is None
        assert bob.events_since(0) == [] and odd.list_grants() == []
        alice.acquire_lease()
        assert bob.leases() == []  # bob's brokers never recover alice's runs
        # a team's rows are shared: alice's hold is in bob's view, settled once
        team = "team:ml"
        h = alice.hold(team, "2026-12-01", 100, 0.5, now=1.0, expires_at=100.0, check=lambda *a: None)
        assert h.startswith("t") and bob.held(team, "2026-12-01") == (100, 0.5)
        assert alice.finish_hold(h, 60, 0.25) is True and bob.finish_hold(h, 60, 0.25) is False
        assert bob.usage(team, "2026-12-01") == (60, 0.25) and alice.usage(team, "2026-12-01") == (60, 0.25)
        # a notebook's own rows are not
        alice.add_usage(nb, "2026-12-01", 7, 0.0)
        assert bob.usage(nb, "2026-12-01") == (0, 0.0)
        # expired team holds are charged by whichever broker sweeps first, once
        bob.hold(team, "2026-12-01", 40, 0.0, now=1.0, expires_at=2.0, check=lambda *a: None)
        assert alice.sweep_holds(3.0) == 1 and bob.sweep_holds(3.0) == 0
        assert bob.usage(team, "2026-12-01") == (100, 0.25)
        # the audit copy is the team's: both users' records in one place
        alice.append_audit(AuditRecord(seq=1, ts=1.0, origin=nb, tool="t", decision="allow"))
        bob.append_audit(AuditRecord(seq=1, ts=2.0, origin=nb, tool="t", decision="deny"))
        assert [r.decision for r in alice.audit_records()] == ["allow", "deny"]
    finally:
        for s in (alice, bob, odd):
            s.close()


def test_a_team_hold_without_owner_is_charged_when_no_users_live_broker_could_own_it(
        postgres_db: tuple[str, Path]) -> None:
    """Team holds an older relay-jupyter wrote (``t<random>``, no owner in the id) no longer wait for
    their expiry once no live broker of any user could have taken them: a live lease of any user's
    schema that started before the hold (or within the allowed clock skew) keeps it waiting."""
    url, pw = postgres_db
    t0 = 2_000_000.0
    clock = [t0]
    alice = PostgresStore.open(url, password_file=pw, namespace="alice", clock=lambda: clock[0])
    bob = PostgresStore.open(url, password_file=pw, namespace="bob", clock=lambda: clock[0])
    try:
        team, day = "team:ml", "2026-12-01"
        # alice's store has no lease: its holds carry no owner, as an older relay-jupyter's did
        old = alice.hold(team, day, 40, 0.4, now=t0 - 3600, expires_at=1e12, check=lambda *a: None)
        recent = alice.hold(team, day, 2, 0.02, now=t0 - 10, expires_at=1e12, check=lambda *a: None)
        assert old.startswith("t") and "@" not in old and "@" not in recent
        bob.acquire_lease()  # bob's broker starts now: it could own `recent` (skew), never `old`
        assert bob.charge_dead_holds() == 1 and alice.charge_dead_holds() == 0
        assert bob.usage(team, day) == (40, 0.4) and alice.held(team, day) == (2, 0.02)
        assert alice.finish_hold(old, 40, 0.4) is False and bob.usage(team, day) == (40, 0.4)  # charged once
        bob.release_lease()  # no user's broker is alive any more
        assert alice.charge_dead_holds() == 1 and bob.usage(team, day) == (42, pytest.approx(0.42)) and bob.held(team, day) == (0, 0.0)
    finally:
        alice.close()
        bob.close()


def test_store_calls_on_worker_threads_each_have_their_own_transaction(pg: PostgresStore) -> None:
    """The broker runs store calls on worker threads (runtime/offload.py): a thread's open transaction is
    its own (its uncommitted write is visible to it, never to another thread, whose read does not wait
    for it), and more threads than pooled connections at once all complete."""
    from relay_jupyter.storage.postgres import POOL_MAX

    try:
        from relay_jupyter.runtime.offload import STORE_THREADS
    except ImportError:  # the store threads' module not there yet: the number it will have
        STORE_THREADS = 16

    # the loop's own calls (event appends) must find a connection while every store thread holds one
    assert POOL_MAX > STORE_THREADS
    inside, checked = threading.Event(), threading.Event()
    seen: list[object] = []

    def reader() -> None:
        inside.wait(30)
        seen.append(pg.get_grant("notebook:x.ipynb"))
        checked.set()

    worker = threading.Thread(target=reader)
    worker.start()
    with pg.transaction():
        pg.put_grant(_grant("notebook:x.ipynb"))
        assert pg.get_grant("notebook:x.ipynb") is not None
        inside.set()
        assert checked.wait(30)
    worker.join(30)
    assert seen == [None] and pg.get_grant("notebook:x.ipynb") is not None
    errors: list[BaseException] = []
    start = threading.Barrier(POOL_MAX + 6)

    def work(n: int) -> None:
        try:
            start.wait(30)
            with pg.transaction():
                pg.add_usage(f"notebook:{n}.ipynb", "2026-12-01", 1, 0.0)
                h = pg.hold("notebook:shared.ipynb", "2026-12-01", 1, 0.0, now=1.0, expires_at=1e12,
                            check=lambda *a: None)
            pg.finish_hold(h, 1, 0.0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(POOL_MAX + 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert pg.usage("notebook:shared.ipynb", "2026-12-01") == (POOL_MAX + 6, 0.0)
    assert all(pg.usage(f"notebook:{n}.ipynb", "2026-12-01") == (1, 0.0) for n in range(POOL_MAX + 6))
