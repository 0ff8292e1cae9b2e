"""Endpoint sessions survive the broker (issue 16 item 4): the lineage of a session's next request is
classified against the history stored by the last request that succeeded — also after the daemon restarted,
or when another broker on the same store answered the previous request.

Real parts: the SQLite store of a data dir and a PostgreSQL store (two connections = two brokers), and a real ``jupyter relay serve``
subprocess with the shipped fake Anthropic upstream and the official ``anthropic`` SDK client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest
from daemon_harness import run_cli, start_daemon

from relay_jupyter.broker.sessions import SessionBook, row_id
from relay_jupyter.storage.sqlite import Store
from relay_jupyter.testing import FakeAnthropic
from relay_jupyter.testing.script import Reply, text

KEY = "sk-ant-persist-upstream-key-0123456789"
MODEL = "claude-test-1"
ORIGIN = "notebook:a.ipynb"


def _body(*texts: str) -> dict:
    roles = ["user", "assistant"]
    return {"system": "sys", "messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=[pytest.mark.pg, pytest.mark.slow])])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Opens another connection to one store, as another broker on it does: the SQLite file of a data dir, or
    one user's schema of a PostgreSQL ``store_url`` (a throwaway cluster)."""
    if request.param == "sqlite":
        return lambda: Store.open(tmp_path / "relay.db")
    from relay_jupyter.storage.postgres import PostgresStore

    url, password_file = request.getfixturevalue("postgres_db")
    return lambda: PostgresStore.open(url, password_file=password_file, namespace="alice")


async def test_two_brokers_on_one_store_share_a_sessions_lineage(open_store: Any) -> None:
    one, two = open_store(), open_store()
    a, b = SessionBook(store=one), SessionBook(store=two)
    headers = {"x-relay-session": "s1"}
    try:
        first = await a.observe_async(ORIGIN, headers, _body("q1"))
        assert first.lineage.kind == "new"
        failed = await b.observe_async(ORIGIN, headers, _body("q1"))
        a.flush()
        assert (await b.observe_async(ORIGIN, headers, _body("q1"))).lineage.kind == "new"  # nothing committed yet
        first.commit()
        a.flush()
        # the other broker (its memory empty) classifies the next request against what the first stored
        nxt = await b.observe_async(ORIGIN, headers, _body("q1", "a1", "q2"))
        assert nxt.lineage.kind == "continuation" and nxt.lineage.kept == 1
        nxt.commit()
        b.flush()
        # and the first broker, whose memory holds the older history, reads the newer one from the store
        undo = await a.observe_async(ORIGIN, headers, _body("q1", "a1", "q2 edited"))
        assert undo.lineage.kind == "undo" and undo.lineage.kept == 2
        del failed
        # a restarted broker (a new book, a new connection) still knows the session
        a.close()
        three = open_store()
        try:
            again = await SessionBook(store=three).observe_async(ORIGIN, headers, _body("q1", "a1", "q2", "a2", "q3"))
            assert again.lineage.kind == "continuation" and again.lineage.kept == 3
            # another notebook naming the same session id has none of it
            other = await SessionBook(store=three).observe_async("notebook:b.ipynb", headers, _body("q1", "a1", "q2"))
            assert other.lineage.kind == "new"
        finally:
            three.close()
        # what is stored: digests only, never a message's text
        row = two.load_conversation(row_id(ORIGIN, "s1"))
        assert row is not None and row["messages"] == [] and "q2" not in json.dumps(row)
        # a row someone tampered with is ignored (a new session), never an exception
        two.save_conversation(row_id(ORIGIN, "s1"), ORIGIN, "", [], {"kind": "endpoint-session", "session": "s1",
                                                                     "digests": "not base64!"})
        fresh = SessionBook(store=two)
        assert (await fresh.observe_async(ORIGIN, headers, _body("q1", "a1", "q2"))).lineage.kind == "new"
        fresh.close()
    finally:
        b.close()
        one.close()
        two.close()


@pytest.mark.slow
def test_a_daemon_restart_between_two_requests_keeps_continuation(tmp_path: Path) -> None:
    with FakeAnthropic(api_key=KEY, models=(MODEL,)) as fake:
        config = tmp_path / "broker.json"
        config.write_text(json.dumps({"anthropic_api_key": KEY, "anthropic_base_url": fake.base_url,
                                      "default_model": MODEL}))
        done = run_cli(tmp_path, "grants", "add", "daemon:sdk", "--tools", "*", "--models", MODEL)
        assert done.returncode == 0, done.stderr
        headers = {"X-Relay-Client": "sdk", "x-relay-session": "restart-1"}
        fake.enqueue(Reply(text("first")), Reply(text("second")))
        history = [{"role": "user", "content": "q1"}]
        for step in range(2):
            daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0", "--config", str(config))
            try:
                client = anthropic.Anthropic(api_key=daemon.token(), base_url=f"http://127.0.0.1:{daemon.port}/relay/anthropic",
                                             default_headers=headers, max_retries=0)
                msg = client.messages.create(model=MODEL, max_tokens=16, messages=history)
                history += [{"role": "assistant", "content": msg.content[0].text}, {"role": "user", "content": "q2"}]
                rows = daemon.rpc("telemetry.query", {}, client="sdk")["result"]["rows"]
                listed = daemon.rpc("conversations.list", {}, client="sdk")["result"]["conversations"]
            finally:
                assert daemon.stop() == 0  # SIGTERM: a graceful stop, the queued history write lands first
            ours = [r for r in rows if r.get("session") == "restart-1"]
            assert [r["lineage"] for r in ours] == (["new"] if step == 0 else ["new", "continuation"])
            assert listed == []  # the stored session history is not a conversation of the client
