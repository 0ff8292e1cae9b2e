"""Attack: spend one small day budget through every door at once.

One origin (``daemon:agent1``) of a real ``jupyter relay serve`` with a day budget that fits a few requests is
driven at the same moment through its three ways to a model: the Anthropic-compatible endpoint (official SDK),
the OpenAI-compatible endpoint (official SDK) and ``%%agent``-style runs over the RPC (``run.start``). Every
upstream answer reports absurd usage, so each forwarded request is charged its whole reservation — the most a
request may cost — and the upstreams answer slowly, so the reservations overlap. Each door has its own test of
concurrency (docs/security.md, "The gate"); here they race each other on one ledger. Held: the ledger never
passes the limit, nothing is left held, every refusal is ``BUDGET_EXCEEDED`` and the upstreams saw only the
requests that were let through. Then the same with two daemons on one data dir (``daemon:agent2``), the three
doors of both racing one day: reservations live in the shared store, not in either process.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace
from typing import Any

import anthropic
import openai
import pytest
from daemon_harness import Daemon, run_cli, start_daemon

from relay_jupyter.testing import FakeAnthropic, FakeOpenAI, Reply, Usage, text

pytestmark = pytest.mark.slow

KEY_A = "sk-ant-attack-budget-upstream-0123456789"
KEY_O = "sk-openai-attack-budget-upstream-0123456789"
MODEL_A, MODEL_O = "claude-test-1", "gpt-test-1"
LIMIT = 10000
EACH = 6  # per door
ABSURD = Usage(input_tokens=10**9, output_tokens=10**9)
CLIENTS = ("agent1", "agent2")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory):
    """Two daemons on one data dir, started once (a daemon's start is most of this module's time); each test
    spends the day of its own origin (``daemon:<client>``), so the tests stay independent."""
    tmp_path = tmp_path_factory.mktemp("budget-doors")
    slow = dict(usage=ABSURD, first_token_delay=0.4)
    with FakeAnthropic(api_key=KEY_A, models=(MODEL_A,), default=Reply(text("spent"), **slow)) as fake_a, \
            FakeOpenAI(api_key=KEY_O, models=(MODEL_O,), default=Reply(text("spent"), **slow)) as fake_o:
        config = tmp_path / "broker.json"
        config.write_text(json.dumps({
            "anthropic_api_key": KEY_A, "anthropic_base_url": fake_a.base_url,
            "data_dir": str(tmp_path / "data" / "relay"),
            "openai_api_key": KEY_O, "openai_base_url": fake_o.base_url, "default_model": MODEL_A}))
        roots = [tmp_path, tmp_path / "broker1"]  # each its own runtime dir and state file, one data dir
        roots[1].mkdir()
        done: list[Any] = [None] * len(CLIENTS)
        daemons: list[Daemon | None] = [None] * len(roots)

        def grant(i: int) -> None:
            done[i] = run_cli(tmp_path, "grants", "add", f"daemon:{CLIENTS[i]}", "--tools", "*", "--models", "*",
                              "--budget", f"tokens={LIMIT},cost=none,rpm=none,steps=none,run_tokens=none")

        def start(i: int) -> None:
            daemons[i] = start_daemon(roots[i], "--listen", "tcp://127.0.0.1:0", "--config", str(config))

        for i in range(len(CLIENTS)):
            grant(i)
        assert all(d.returncode == 0 for d in done), [d.stderr for d in done]
        try:  # one after the other: on a loaded machine two at once only make each slower
            for i in range(len(roots)):
                start(i)
            assert all(daemons), "a daemon did not start"
            token = daemons[0].token()  # one data dir, one token
            yield SimpleNamespace(daemons=daemons, fake_a=fake_a, fake_o=fake_o, tokens=[token, token])
        finally:
            for d in daemons:
                if d is not None:
                    d.stop()


def test_one_day_budget_holds_across_the_rpc_and_both_model_endpoints(rig) -> None:
    _race(rig, brokers=1, client=CLIENTS[0])


def test_one_day_budget_holds_across_two_daemons_on_one_data_dir_and_all_three_doors(rig) -> None:
    """Two ``jupyter relay serve`` on one data dir (a tested configuration, docs/storage.md), each driven
    through its three doors at once: the reservations are in the shared store, so the two brokers together
    never pass the day either."""
    _race(rig, brokers=2, client=CLIENTS[1])


def _race(rig: SimpleNamespace, *, brokers: int, client: str) -> None:
    fake_a, fake_o = rig.fake_a, rig.fake_o
    daemons: list[Daemon] = rig.daemons[:brokers]
    seen_a, seen_o = len(fake_a.requests), len(fake_o.requests)
    headers = {"X-Relay-Client": client}
    token = dict(zip(map(id, daemons), rig.tokens))  # each daemon's own token (its data dir's)
    a_clients = [anthropic.Anthropic(api_key=token[id(d)], base_url=f"http://127.0.0.1:{d.port}/relay/anthropic",
                                     default_headers=headers, max_retries=0, timeout=60) for d in daemons]
    o_clients = [openai.OpenAI(api_key=token[id(d)], base_url=f"http://127.0.0.1:{d.port}/relay/openai/v1",
                               default_headers=headers, max_retries=0, timeout=60) for d in daemons]
    outcomes: list[tuple[str, str]] = []
    run_ids: list[tuple[Daemon, str]] = []
    lock = threading.Lock()
    go = threading.Event()

    def via_anthropic(n: int) -> None:
        go.wait()
        try:
            a_clients[n % brokers].messages.create(model=MODEL_A, max_tokens=400,
                                                   messages=[{"role": "user", "content": "spend"}])
            result = "ok"
        except anthropic.APIStatusError as exc:
            result = "BUDGET_EXCEEDED" if "BUDGET_EXCEEDED" in str(exc) else f"other: {exc}"
        with lock:
            outcomes.append(("anthropic", result))

    def via_openai(n: int) -> None:
        go.wait()
        try:
            o_clients[n % brokers].chat.completions.create(model=MODEL_O, max_tokens=400,
                                                           messages=[{"role": "user", "content": "spend"}])
            result = "ok"
        except openai.APIStatusError as exc:
            result = "BUDGET_EXCEEDED" if "BUDGET_EXCEEDED" in str(exc) else f"other: {exc}"
        with lock:
            outcomes.append(("openai", result))

    def via_rpc(n: int) -> None:
        go.wait()
        answer = _rpc(daemons[n % brokers], token[id(daemons[n % brokers])], "run.start", client=client, params={
            "conversation": f"race{n}", "prompt": "spend", "model": MODEL_A, "max_tokens": 400, "mode": "full"})
        with lock:
            if "result" in answer:
                run_ids.append((daemons[n % brokers], answer["result"]["run_id"]))
            else:
                outcomes.append(("rpc", "BUDGET_EXCEEDED" if answer["error"]["data"].get("code")
                                 == "BUDGET_EXCEEDED" else f"other: {answer}"))

    threads = [threading.Thread(target=f, args=(i,)) for i in range(EACH if brokers == 1 else 4 * brokers)
               for f in (via_anthropic, via_openai, via_rpc)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)

    deadline = time.monotonic() + 90
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = [_rpc(d, token[id(d)], "runs.get", {"run_id": r}, client)["result"]["run"] for d, r in run_ids]
        if all(r["state"] not in ("running", "pending", "waiting") for r in runs):
            break
        time.sleep(0.2)
    states = [r["state"] for r in runs]
    assert all(s in ("done", "budget_exhausted") for s in states), states

    usage = _rpc(daemons[-1], token[id(daemons[-1])], "budget.get", {}, client)["result"]["usage"]

    others = [o for o in outcomes if o[1] not in ("ok", "BUDGET_EXCEEDED")]
    assert not others, others
    passed = sum(o[1] == "ok" for o in outcomes) + states.count("done")
    refused = sum(o[1] == "BUDGET_EXCEEDED" for o in outcomes) + states.count("budget_exhausted")
    assert passed >= 1 and refused >= 1, (outcomes, states)  # the limit was contested
    assert usage["tokens_limit"] == LIMIT
    assert usage["tokens"] <= LIMIT, usage  # the attack: three doors never pass one day together
    assert usage["reserved_tokens"] == 0, usage  # nothing left held after every request ended
    forwarded = len([r for r in fake_a.requests[seen_a:] if r.path.endswith("/messages")]) + \
        len([r for r in fake_o.requests[seen_o:] if r.path.endswith("/chat/completions")])
    assert forwarded == passed, (forwarded, passed, outcomes, states)  # a refusal reached no upstream


def _rpc(daemon: Daemon, token: str, method: str, params: dict[str, Any], client: str) -> dict[str, Any]:
    """One JSON-RPC call as ``client`` with ``token`` (a daemon on a shared data dir has none in its own root)."""
    conn = daemon.connect()
    try:
        return conn.rpc(method, params, {"Authorization": f"Bearer {token}", "X-Relay-Client": client})
    finally:
        conn.close()


@pytest.fixture
def pg_rig(postgres_db, tmp_path: Path):
    """Two daemons of one user, each with its own data dir (its own token, audit log, socket) and one
    PostgreSQL ``store_url`` (docs/multi-user.md): the ledger they share is the database's."""
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    from relay_jupyter.core.grants import GrantBook
    from relay_jupyter.core.types import Budget, Grant
    from relay_jupyter.storage.postgres import PostgresStore

    url, password_file = postgres_db
    with PostgresStore.open(url, password_file=password_file, namespace="carol") as store:
        GrantBook(store).issue(Grant(origin=f"daemon:{CLIENTS[0]}", tools=frozenset({"*"}), models=frozenset({"*"}),
                                     consent_id="terminal",
                                     budget=Budget(requests_per_minute=None, tokens_per_day=LIMIT,
                                                   cost_per_day_usd=None, max_steps_per_run=None,
                                                   max_tokens_per_run=None)))
    slow = dict(usage=ABSURD, first_token_delay=0.4)
    with FakeAnthropic(api_key=KEY_A, models=(MODEL_A,), default=Reply(text("spent"), **slow)) as fake_a, \
            FakeOpenAI(api_key=KEY_O, models=(MODEL_O,), default=Reply(text("spent"), **slow)) as fake_o:
        daemons: list[Daemon | None] = [None, None]

        def start(i: int) -> None:
            root = tmp_path / f"broker{i}"
            root.mkdir()
            config = root / "broker.json"
            config.write_text(json.dumps({
                "data_dir": str(root / "relay"), "store_url": url, "store_password_file": str(password_file),
                "user": "carol", "anthropic_api_key": KEY_A, "anthropic_base_url": fake_a.base_url,
                "openai_api_key": KEY_O, "openai_base_url": fake_o.base_url, "default_model": MODEL_A}))
            daemons[i] = start_daemon(root, "--listen", "tcp://127.0.0.1:0", "--config", str(config))

        try:
            for i in range(2):
                start(i)
            assert all(daemons), "a daemon did not start"
            tokens = [(tmp_path / f"broker{i}" / "relay" / "daemon_token").read_text().strip() for i in range(2)]
            yield SimpleNamespace(daemons=daemons, fake_a=fake_a, fake_o=fake_o, tokens=tokens)
        finally:
            for d in daemons:
                if d is not None:
                    d.stop()


@pytest.mark.pg
def test_one_day_budget_holds_across_two_daemons_on_one_postgresql_store_and_all_three_doors(pg_rig) -> None:
    _race(pg_rig, brokers=2, client=CLIENTS[0])
