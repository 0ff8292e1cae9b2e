"""The broker as a JupyterHub-managed service under its own system user (issue 15 item 4): one real hub
(dummy authenticator, configurable-http-proxy), the relay service as ``relayt-svc``, real system users.

- a user's hub token reaches the broker (through the hub's proxy and directly) and gets the origin
  ``user:<name>/notebook:<path>``; a missing, wrong, or scope-less token is refused;
- another user's token cannot see, revoke or spend the first user's grants, budget or audit;
- hub groups are teams: alice's spend is gone from bob's team budget (group ``ml``), carol has no team;
- a process of the user (what their kernel code can do) cannot read the service's key, settings, store
  or environment;
- a single-user Jupyter server that finds the service is a thin client: no relay endpoints of its own, its
  kernel's ``relay.budget()`` is answered by the service for the user's origin.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from relay_jupyter.server.hub_service import token_server
from relay_jupyter.testing import FakeAnthropic, Reply, Usage, text, tool_use

from .hub_rig import HUB_LABEXTENSION, KEY, SERVICE, Hub, require_peers, run_as, service_cli

pytestmark = [pytest.mark.hub, pytest.mark.pg, pytest.mark.slow]

TEAM_LIMIT = 10_000_000
ALICE, BOB, CAROL = "relayt-alice", "relayt-bob", "relayt-carol"
ACCESS = f"access:services!service={SERVICE}"


@pytest.fixture(scope="module")
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


@pytest.fixture(scope="module")
def hub(fake, postgres_cluster):
    require_peers()
    # the service's store: PostgreSQL with scram over TCP (the role's password only in the service user's file)
    url = postgres_cluster.create_database()
    # team "ml" lists no members: its members are the hub group "ml" (alice and bob)
    try:
        with Hub(fake.base_url, teams={"ml": {"tokens_per_day": TEAM_LIMIT}, "race": {}}, store_url=url,
                 store_password=postgres_cluster.password_file.read_text().strip()) as h:
            yield h
    finally:
        postgres_cluster.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(scope="module")
def tokens(hub):
    return {
        ALICE: hub.token(ALICE, [ACCESS]),
        BOB: hub.token(BOB, [ACCESS]),
        CAROL: hub.token(CAROL, [ACCESS]),
        "carol-no-access": hub.token(CAROL, ["read:users:name!user"]),
    }


def _grant(hub: Hub, token: str, client: str = "kernel:analysis.ipynb") -> dict:
    reply = hub.rpc(token, "grants.create", {"tools": ["*"], "models": ["*"]}, client=client)
    assert "result" in reply, reply
    return reply["result"]["grant"]


def _run(hub: Hub, token: str, prompt: str, client: str = "kernel:analysis.ipynb") -> dict:
    import time

    reply = hub.rpc(token, "run.start", {"conversation": "c1", "prompt": prompt}, client=client)
    assert "result" in reply, reply
    run_id = reply["result"]["run_id"]
    deadline = time.monotonic() + 60
    while True:
        run = hub.rpc(token, "runs.get", {"run_id": run_id}, client=client)["result"]["run"]
        if run["state"] != "running":
            return run
        assert time.monotonic() < deadline, run
        time.sleep(0.2)  # the run ends in the service process; polling its journal


def test_a_users_token_gets_her_origin_and_other_tokens_are_refused(hub, tokens) -> None:
    grant = _grant(hub, tokens[ALICE])
    assert grant["origin"] == f"user:{ALICE}/notebook:analysis.ipynb"
    # directly to the service too (kernels on the hub's host may skip the proxy)
    direct = hub.rpc(tokens[ALICE], "grants.get", {}, via_proxy=False)
    assert direct["result"]["grant"]["origin"] == grant["origin"]
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.get", "params": {}}).encode()
    no_token = hub.request("rpc", token=None, body=body)
    wrong = hub.request("rpc", token="0" * 64, body=body)
    assert no_token[0] == wrong[0] == 401 and no_token[1] == wrong[1]
    status, raw = hub.request("rpc", token=tokens["carol-no-access"], body=body)
    assert status == 403 and ACCESS.encode() in raw
    # the service's own token is no user's
    assert hub.request("rpc", token=hub.admin_token, body=body)[0] in (401, 403)
    # a token in the URL is refused whatever it is
    assert hub.request(f"rpc?token={tokens[ALICE]}", token=None, body=body)[0] == 400


def test_a_revoked_hub_token_is_refused_once_the_services_cache_expires(hub) -> None:
    """The service reuses the hub's answer about a token for --auth-cache seconds (AUTH_CACHE here, 10 by
    default): after the hub revokes a token the service refuses it like a wrong one, with no restart."""
    import time

    status, reply = hub.hub_api("POST", f"users/{ALICE}/tokens", {"note": "revoked", "expires_in": 3600,
                                                                   "scopes": [ACCESS]})
    assert status == 201, reply
    token, token_id = reply["token"], reply["id"]
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.get", "params": {}}).encode()
    assert hub.request("rpc", token=token, body=body, via_proxy=False)[0] == 200
    assert hub.hub_api("DELETE", f"users/{ALICE}/tokens/{token_id}")[0] == 204
    deadline = time.monotonic() + 60
    while (answer := hub.request("rpc", token=token, body=body, via_proxy=False))[0] == 200:
        assert time.monotonic() < deadline, "a revoked token still works"
        time.sleep(0.5)  # the service's cache of the hub's answer expiring (AUTH_CACHE seconds)
    assert answer == hub.request("rpc", token="0" * 64, body=body, via_proxy=False)  # the one 401 of a wrong token


def test_another_user_cannot_see_or_spend_alices_grants(hub, tokens, fake) -> None:
    alice_origin = _grant(hub, tokens[ALICE])["origin"]
    bob = tokens[BOB]
    # bob's notebook of the same name is his own origin: no grant there
    assert hub.rpc(bob, "grants.get", {})["result"]["grant"] is None
    assert hub.rpc(bob, "grants.list", {})["result"]["grants"] == []
    for method, params in (("grants.get", {"origin": alice_origin}), ("grants.revoke", {"origin": alice_origin}),
                           ("budget.get", {"origin": alice_origin}), ("audit.tail", {"origin": alice_origin}),
                           ("grants.create", {"tools": ["*"], "models": ["*"], "origin": alice_origin})):
        reply = hub.rpc(bob, method, params)
        assert reply.get("error", {}).get("data", {}).get("code") == "UNAUTHORIZED", (method, reply)
    # without a grant of his own, bob's run is refused: alice's grant is not his
    sent = len(fake.requests)
    run = _run(hub, bob, "spend alice's budget")
    assert run["state"] != "done" and len(fake.requests) == sent, run  # nothing reached the model
    assert hub.rpc(tokens[ALICE], "grants.get", {})["result"]["grant"]["origin"] == alice_origin  # untouched


def test_hub_groups_are_teams_alices_spend_is_gone_from_bobs_team_budget(hub, tokens, fake) -> None:
    _grant(hub, tokens[ALICE], client="kernel:team.ipynb")
    before = hub.rpc(tokens[BOB], "budget.get", {})["result"]["usage"]
    assert {t["team"] for t in before["teams"]} == {"ml", "race"}  # bob's hub groups
    [team_before] = [t for t in before["teams"] if t["team"] == "ml"]
    fake.enqueue(Reply(text("alice's answer"), usage=Usage(input_tokens=600, output_tokens=400)))
    run = _run(hub, tokens[ALICE], "alice asks", client="kernel:team.ipynb")
    # done: the service sent its own key (the fake answers 401 to any other); alice never had one
    assert run["state"] == "done", run
    after = hub.rpc(tokens[BOB], "budget.get", {})["result"]["usage"]
    [team] = [t for t in after["teams"] if t["team"] == "ml"]
    assert team["day"]["tokens"] - team_before["day"]["tokens"] == 1000
    assert team["remaining_tokens"] == TEAM_LIMIT - team["day"]["tokens"]
    # carol is in no hub group: no team budget
    assert hub.rpc(tokens[CAROL], "budget.get", {})["result"]["usage"].get("teams", []) == []
    # the admin view, run as the service's user on its PostgreSQL store: spend per hub user, not per service
    out = service_cli(hub, "teams", "spend", "--json")
    assert out.returncode == 0, out.stderr
    spend = json.loads(out.stdout)
    assert {r["user"] for r in spend if r["user"]} == {ALICE}, spend
    assert sum(r["tokens"] for r in spend if r["user"] == ALICE) >= 1000
    assert any(r["team"] == "ml" and r["tokens"] >= 1000 for r in spend)
    # audit --team: the team "ml" lists no members in the settings; its members are the hub group's, from the copy the
    # service keeps of its teams' groups (read with its own token), or live with a hub token in the environment
    for env in (None, {"JUPYTERHUB_API_URL": f"{hub.url}/hub/api", "JUPYTERHUB_API_TOKEN": hub.admin_token}):
        out = service_cli(hub, "audit", "--team", "ml", "--json", env=env)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        users = {r["origin"].split("/", 1)[0] for r in rows}
        assert f"user:{ALICE}" in users and users <= {f"user:{ALICE}", f"user:{BOB}"}, (env, users)
    listed = service_cli(hub, "teams", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {r["team"]: r["members"] for r in json.loads(listed.stdout)}["ml"] == sorted([ALICE, BOB])
    refused = service_cli(hub, "audit", "--team", "ml", "--json", env={"JUPYTERHUB_API_URL": f"{hub.url}/hub/api",
                                                                         "JUPYTERHUB_API_TOKEN": "0" * 64})
    # a token that may not read the group (a user's server token in her terminal): one line, then the service's copy
    assert refused.returncode == 0 and "hub group 'ml'" in refused.stderr and "0" * 64 not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert any(r["origin"].startswith(f"user:{ALICE}/") for r in json.loads(refused.stdout))


_PROBE = r"""
import json, os, sys
out = {}
for name, path in json.loads(sys.argv[1] if len(sys.argv) > 1 else os.environ["PROBE"]).items():
    try:
        with open(path, "rb") as fh:
            fh.read(1)
        out[name] = "read"
    except PermissionError:
        out[name] = "denied"
    except FileNotFoundError:
        out[name] = "missing"
print(json.dumps(out))
"""


def _audit_file(hub: Hub) -> Path:
    return next(p for p in hub.service_data.rglob("audit-hub.jsonl"))


def test_a_users_process_cannot_read_the_services_key_settings_store_or_environment(hub, tokens) -> None:
    _grant(hub, tokens[ALICE])  # the store exists by now
    pids = hub.service_pids()
    assert pids, "the relay service runs as its own user"
    assert hub.store_password_file is not None
    targets = {"settings (holds the key)": str(hub.service_config),
               "database password": str(hub.store_password_file), "audit log": str(_audit_file(hub)),
               **{f"environ of {pid}": f"/proc/{pid}/environ" for pid in pids}}
    assert KEY in hub.service_config.read_text()  # root can: the key is really there
    seen = run_as(ALICE, _PROBE, env={"PROBE": json.dumps(targets)})
    assert seen == {name: "denied" for name in targets}, seen


def test_a_single_user_server_that_finds_the_service_is_a_thin_client(hub, tokens, fake, tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))
    from real_server import RealServer

    alice = tokens[ALICE]

    class Thin(RealServer):
        def env(self) -> dict[str, str]:
            env = super().env()
            env.update(JUPYTERHUB_API_TOKEN=alice, JUPYTERHUB_USER=ALICE, ANTHROPIC_API_KEY="sk-ant-not-for-kernels")
            return env

    with Thin(tmp_path, {"hub_service_url": f"{hub.url}/services/{SERVICE}/"}) as srv:
        # no broker in the user's server: its relay endpoints are not mounted
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(srv.url + "relay/healthz",
                                                          headers={"Authorization": "token relay-test-token"}),
                                   timeout=10)
        assert err.value.code == 404
        kc = srv.kernel_for("thin.ipynb")
        code = ("import os, json\n"
                "print(json.dumps({k: os.environ.get(k) for k in ('RELAY_URL', 'RELAY_KERNEL_CREDENTIAL', "
                "'ANTHROPIC_API_KEY', 'JUPYTERHUB_API_TOKEN')} | {'token': os.environ.get('RELAY_TOKEN') == "
                f"{alice!r}}}))\n")
        env = json.loads(_execute(kc, code).strip().splitlines()[-1])
        assert env == {"RELAY_URL": f"{hub.url}/services/{SERVICE}/relay/", "RELAY_KERNEL_CREDENTIAL": None,
                       "ANTHROPIC_API_KEY": None, "JUPYTERHUB_API_TOKEN": None, "token": True}
        _execute(kc, "%load_ext relay_jupyter")
        out = _execute(kc, "g = relay.connect(['*'])\nprint('ORIGIN', g['origin'])")
        origin = next(line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("ORIGIN "))
        assert origin.startswith(f"user:{ALICE}/notebook:") and origin.endswith("thin.ipynb"), out
        # %%agent in the thin server's kernel: the service runs it with its key and streams the answer back
        fake.enqueue(Reply(text("an answer through the hub service"), usage=Usage(input_tokens=5, output_tokens=5)))
        shown = _execute(kc, "%%agent\nsay something")
        assert "an answer through the hub service" in shown, shown
        _kernel_restart_cancels_its_runs_and_withdraws_its_cards(hub, srv, kc, alice, origin, fake)


def _kernel_restart_cancels_its_runs_and_withdraws_its_cards(hub: Hub, srv, kc, alice: str, origin: str,
                                                            fake) -> None:
    """Kernel lifetime through the thin client (issue 12): the thin server tells the service (kernel.ended), which
    cancels the run that waits on the kernel's consent card and withdraws the card; the kernel's user token
    still answers nothing of it afterwards."""
    import time

    # her panel sees the card (the kernel's client id carries its instance id, which only the kernel and its server know)
    fake.enqueue(Reply(text("I will write."), tool_use("run_code", {"code": "open('restart.txt', 'w').write('x')"})))
    kc.execute("%%agent\nwrite restart.txt", allow_stdin=True)  # the cell shows the card and waits (not headless)
    deadline = time.monotonic() + 60
    while not (pending := _panel(hub, alice, "permission.pending")["result"]["requests"]):
        assert time.monotonic() < deadline, "no consent card"
        time.sleep(0.2)  # the run reaching its card in the service
    [card] = pending
    [session] = [s for s in srv.api("GET", "api/sessions") if s["path"].endswith("thin.ipynb")]
    srv.api("POST", f"api/kernels/{session['kernel']['id']}/restart")
    deadline = time.monotonic() + 60
    while (run := _panel(hub, alice, "runs.get", {"run_id": card["run_id"]})["result"]["run"])["state"] == "running":
        assert time.monotonic() < deadline, run
        time.sleep(0.2)  # the thin server's kernel.ended reaching the service
    assert run["state"] == "cancelled", run
    assert _panel(hub, alice, "permission.pending")["result"]["requests"] == []
    late = _panel(hub, alice, "permission.answer", {"request_id": card["request_id"], "decision": "allow"})
    assert late["error"]["data"]["code"] == "CONFLICT", late
    assert not (srv.root / "restart.txt").exists()


def _execute(kc, code: str, timeout: float = 60) -> str:
    msg_id = kc.execute(code)
    chunks: list[str] = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            chunks.append(content["text"])
        elif kind in ("display_data", "update_display_data", "execute_result"):
            data = content.get("data", {})
            chunks.append(str(data.get("text/markdown") or data.get("text/html") or data.get("text/plain") or ""))
        elif kind == "error":
            raise AssertionError("\n".join(content["traceback"])[-3000:])
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(chunks)



def _ws_execute(url: str, token: str, cells: list[str], timeout: float = 120) -> list[str]:
    """Run ``cells`` in a kernel through the Jupyter server's websocket (what JupyterLab does); each cell's text."""
    import asyncio
    import uuid

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def go() -> list[str]:
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}, connect_timeout=60))
        session = uuid.uuid4().hex
        outputs = []
        try:
            for code in cells:
                msg_id = uuid.uuid4().hex
                await ws.write_message(json.dumps({
                    "header": {"msg_id": msg_id, "username": "test", "session": session, "msg_type": "execute_request",
                               "version": "5.3", "date": ""},
                    "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                    "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                                "allow_stdin": False, "stop_on_error": True}}))
                chunks: list[str] = []
                while True:
                    raw = await asyncio.wait_for(ws.read_message(), timeout)
                    assert raw is not None, "the kernel's websocket closed"
                    msg = json.loads(raw)
                    if msg.get("channel") != "iopub" or msg["parent_header"].get("msg_id") != msg_id:
                        continue
                    kind, content = msg["msg_type"], msg["content"]
                    if kind == "stream":
                        chunks.append(content["text"])
                    elif kind in ("display_data", "update_display_data", "execute_result"):
                        data = content.get("data", {})
                        chunks.append(str(data.get("text/markdown") or data.get("text/html") or data.get("text/plain") or ""))
                    elif kind == "error":
                        raise AssertionError("\n".join(content["traceback"])[-3000:])
                    elif kind == "status" and content["execution_state"] == "idle":
                        break
                outputs.append("".join(chunks))
        finally:
            ws.close()
        return outputs

    return asyncio.run(go())


def test_a_spawned_users_kernel_reaches_the_service_and_cannot_read_it(hub, tokens, fake) -> None:
    """A real spawn (LocalProcessSpawner as relayt-alice): her server is a thin client found through the
    spawner's environment, her kernel runs as her OS user with her server's token, its %%agent is answered
    by the service, and the same kernel's code is denied the service's files and environment."""
    import pwd
    import time
    import urllib.request

    status, reply = hub.hub_api("POST", f"users/{ALICE}/server")
    assert status in (201, 202), (status, reply)
    try:
        deadline = time.monotonic() + 180
        while True:
            status, model = hub.hub_api("GET", f"users/{ALICE}")
            server = (model or {}).get("servers", {}).get("", {}) if status == 200 else {}
            if server.get("ready"):
                break
            assert time.monotonic() < deadline, hub.log_text()[-3000:]
            time.sleep(0.5)  # the hub spawning another process
        token = hub.token(ALICE, [ACCESS, f"access:servers!user={ALICE}"])
        req = urllib.request.Request(
            f"{hub.url}/user/{ALICE}/api/sessions", method="POST",
            data=json.dumps({"path": "spawned.ipynb", "type": "notebook", "name": "spawned.ipynb",
                             "kernel": {"name": "python3"}}).encode(),
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            kernel_id = json.loads(resp.read())["kernel"]["id"]
        targets = {"settings": str(hub.service_config), "database password": str(hub.store_password_file),
                   "audit log": str(_audit_file(hub)),
                   **{f"environ of {pid}": f"/proc/{pid}/environ" for pid in hub.service_pids()}}
        probe = ("import json, os\nout = {}\n"
                 f"for name, path in {targets!r}.items():\n"
                 "    try:\n        open(path, 'rb').read(1); out[name] = 'read'\n"
                 "    except PermissionError:\n        out[name] = 'denied'\n"
                 "print(json.dumps({'seen': out, 'uid': os.getuid(), 'url': os.environ.get('RELAY_URL'),"
                 " 'credential': 'RELAY_KERNEL_CREDENTIAL' in os.environ, 'token': bool(os.environ.get('RELAY_TOKEN'))}))")
        fake.enqueue(Reply(text("an answer for a spawned kernel"), usage=Usage(input_tokens=5, output_tokens=5)))
        ws_url = f"ws://127.0.0.1:{hub.port}/user/{ALICE}/api/kernels/{kernel_id}/channels"
        seen, connected, answer = _ws_execute(ws_url, token, [
            probe,
            "%load_ext relay_jupyter\ng = relay.connect(['*'])\nprint('ORIGIN', g['origin'])",
            "%%agent\nsay something",
        ])
        facts = json.loads(seen.strip().splitlines()[-1])
        assert facts["uid"] == pwd.getpwnam(ALICE).pw_uid  # the kernel is alice's OS user
        assert facts["seen"] == {name: "denied" for name in targets}, facts
        assert facts["url"] == f"{hub.url}/services/{SERVICE}/relay/" and facts["token"] and not facts["credential"]
        origin = next(line.split(" ", 1)[1] for line in connected.splitlines() if line.startswith("ORIGIN "))
        assert origin.startswith(f"user:{ALICE}/notebook:") and origin.endswith("spawned.ipynb"), connected
        assert "an answer for a spawned kernel" in answer, answer
    finally:
        hub.hub_api("DELETE", f"users/{ALICE}/server")


class _Cell:
    """A cell sent to a kernel through the Jupyter server's websocket and left running (a cell waiting on a consent
    card): :meth:`start` returns once the kernel took it (its ``execute_input``); a thread keeps reading its output
    until the cell ends or its websocket closes (its server killed), for the failure messages."""

    def __init__(self, url: str, token: str, code: str) -> None:
        import threading

        self.url, self.token, self.code = url, token, code
        self.output: list[str] = []
        self.taken = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self, timeout: float = 60) -> _Cell:
        self.thread.start()
        assert self.taken.wait(timeout), f"the kernel did not take the cell: {self.text}"
        return self

    @property
    def text(self) -> str:
        return "".join(self.output)[-2000:]

    def _run(self) -> None:
        import asyncio

        try:
            asyncio.run(self._go())
        except Exception as exc:  # the server killed under it: the output so far stays
            self.output.append(f"[websocket: {type(exc).__name__}]")
            self.taken.set()

    async def _go(self) -> None:
        import uuid

        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        ws = await websocket_connect(HTTPRequest(self.url, headers={"Authorization": f"token {self.token}"},
                                                 connect_timeout=60))
        msg_id = uuid.uuid4().hex
        try:
            await ws.write_message(json.dumps({
                "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
                           "msg_type": "execute_request", "version": "5.3", "date": ""},
                "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                # allow_stdin as JupyterLab sends it: the kernel shows the card and waits (False is a headless runner)
                "content": {"code": self.code, "silent": False, "store_history": True, "user_expressions": {},
                            "allow_stdin": True, "stop_on_error": True}}))
            while True:
                raw = await ws.read_message()
                if raw is None:
                    return
                msg = json.loads(raw)
                if msg.get("channel") != "iopub" or msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "execute_input":
                    self.taken.set()
                elif kind == "stream":
                    self.output.append(content["text"])
                elif kind in ("display_data", "update_display_data", "execute_result"):
                    data = content.get("data", {})
                    self.output.append(str(data.get("text/markdown") or data.get("text/plain") or ""))
                elif kind == "error":
                    self.output.append("\n".join(content["traceback"])[-2000:])
                elif kind == "status" and content["execution_state"] == "idle":
                    return
        finally:
            ws.close()


def _panel(hub: Hub, token: str, method: str, params: dict | None = None) -> dict:
    """One RPC as the user's side panel (what her server's panel proxy sends): it sees all her origins."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode()
    status, raw = hub.request("rpc", token=token, body=body, client="test", headers={"X-Relay-Panel": "1"})
    assert status == 200, (status, raw[:500])
    return json.loads(raw)


def _a_named_servers_clients_end_with_it_while_her_default_server_runs(hub: Hub, fake, panel_token: str, wait,
                                                                       pending) -> None:
    """Named servers (docs/multi-user.md, "Kernel lifetime on a hub"): while alice's default server runs, a kernel
    client holding her named server ``gpu``'s token (what that server's ``$JUPYTERHUB_API_TOKEN`` holds with
    ``c.Spawner.server_token_scopes`` = ``access:servers!server``: ``access:servers!server=<user>/gpu``; the hub lists
    no such server, as after it was killed) has its card (a direct ``tools.call`` of ``run_code``) withdrawn at the
    service's next check (never seen while its server was there: before, her default server kept every client of hers
    and the card waited the consent timeout), and that kernel instance is refused after, on the RPC and on the SDK
    endpoint (410). A client with her default server's token, whose run's card was pending first, keeps it."""
    import threading

    tokens = {"main": hub.token(ALICE, [ACCESS, f"access:servers!server={ALICE}/"]),
              "gpu": hub.token(ALICE, [ACCESS, f"access:servers!server={ALICE}/gpu"])}
    inst = {"main": "00000000000000aa", "gpu": "00000000000000bb"}

    def call(name: str, path: str, msg: dict) -> tuple[int, dict]:
        status, raw = hub.request(path, token=tokens[name], body=json.dumps(msg).encode(), client=f"kernel:{name}.ipynb",
                                  headers={"X-Relay-Instance": inst[name]})
        return status, json.loads(raw)

    def rpc(name: str, method: str, params: dict | None = None) -> tuple[int, dict]:
        return call(name, "rpc", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})

    for name in ("main", "gpu"):
        status, reply = rpc(name, "grants.create", {"tools": ["*"], "models": ["*"]})
        assert status == 200 and "result" in reply, reply
    # the default server's client: a run waiting on its card
    before = pending()
    fake.enqueue(Reply(text("I will write."), tool_use("run_code", {"code": "open('main.txt', 'w')"})))
    status, reply = rpc("main", "run.start", {"conversation": "named", "prompt": "write main.txt"})
    assert status == 200 and "result" in reply, reply
    [card] = wait("no card from the main client", lambda: [r for i, r in pending().items() if i not in before])
    assert card["originator"] == f"user:{ALICE}/kernel:main.ipynb#{inst['main']}", card
    # the gone server's client: a direct call waiting on its card (live only once the card is there, so no check can
    # end it before; a run could be ended before its model asked, which is a race a test must not have)
    answer: dict = {}

    def gpu_call() -> None:
        try:
            answer["reply"] = rpc("gpu", "tools.call", {"conversation": "named", "tool": "run_code",
                                                        "arguments": {"code": "open('gpu.txt', 'w')"}})
        except Exception as exc:  # the failure message below, not a stray thread's warning
            answer["error"] = repr(exc)[:2000]

    call_gpu = threading.Thread(target=gpu_call, daemon=True)
    call_gpu.start()
    call_gpu.join(60)
    assert not call_gpu.is_alive(), "the gone named server's client's card was not withdrawn"
    assert "reply" in answer, answer
    status, reply = answer["reply"]
    assert status == 200 and "lost its server" in json.dumps(reply), reply
    gpu_id = f"user:{ALICE}/kernel:gpu.ipynb#{inst['gpu']}"
    assert not [r for r in pending().values() if r["originator"] == gpu_id]
    # the same sweep kept the default server's client (both were live in it: one hub call for her)
    assert card["request_id"] in pending()
    assert _panel(hub, panel_token, "runs.get", {"run_id": card["run_id"]})["result"]["run"]["state"] == "running"
    status, reply = rpc("gpu", "permission.pending")
    assert status == 410 and "server is gone" in reply["message"], (status, reply)
    status, reply = call("gpu", "anthropic/v1/messages", {"model": "claude-test-1", "max_tokens": 10,
                                                          "messages": [{"role": "user", "content": "hi"}]})
    assert status == 410, (status, reply)
    status, reply = rpc("main", "run.cancel", {"run_id": card["run_id"]})
    assert status == 200 and reply["result"]["cancelled"], reply
    wait("the default server's client's card stayed", lambda: card["request_id"] not in pending(), 30)
    assert not (Path(f"/home/{ALICE}") / "gpu.txt").exists()


def test_a_kernels_end_withdraws_its_own_runs_anonymous_shared_name_and_killed_server(hub, tokens, fake) -> None:
    """Kernel lifetime on a hub, the three gaps of issue 15 (docs/multi-user.md, "Kernel lifetime"), on a real
    spawned server as alice:

    - a kernel started without a notebook (``/api/kernels``, no session): the thin server gave it its instance id,
      so it is ``kernel:anon-<instance>`` and its shutdown cancels its run and withdraws its card;
    - two kernels whose sessions have one notebook name (``JPY_SESSION_NAME`` equal: one origin): shutting one
      down ends its own run only, the other's card stays pending and its run running;
    - the server itself SIGKILLed (no ``kernel.ended`` at all): the hub's poll deletes its token, and the service,
      checking the servers of kernels with live runs, cancels the surviving kernel's run and withdraws its card;
      a late Approve is ``CONFLICT`` and nothing is written.
    """
    import signal
    import time
    import urllib.request

    from .hub_rig import pids_of

    panel_token = tokens[ALICE]  # her own token (not the server's): it outlives the server

    def wait(what: str, check, timeout: float = 90, describe=lambda: ""):
        deadline = time.monotonic() + timeout
        while not (value := check()):
            assert time.monotonic() < deadline, f"{what} {describe()}"
            time.sleep(0.3)  # the service acting on a kernel's end, or the hub on a killed server
        return value

    def cancelled(what: str, card: dict, timeout: float = 90) -> None:
        run = lambda: _panel(hub, panel_token, "runs.get", {"run_id": card["run_id"]})["result"]["run"]  # noqa: E731
        wait(what, lambda: run()["state"] == "cancelled", timeout, describe=lambda: f"run {run()}")

    def pending() -> dict[str, dict]:
        return {r["request_id"]: r for r in _panel(hub, panel_token, "permission.pending")["result"]["requests"]}

    def run_state(run_id: str) -> str:
        return _panel(hub, panel_token, "runs.get", {"run_id": run_id})["result"]["run"]["state"]

    def new_card(before: dict[str, dict]) -> dict:
        fresh = wait("no new consent card", lambda: [r for i, r in pending().items() if i not in before])
        assert len(fresh) == 1, fresh
        return fresh[0]

    status, reply = hub.hub_api("POST", f"users/{ALICE}/server")
    assert status in (201, 202), (status, reply)
    try:
        wait("alice's server never became ready", lambda: (hub.hub_api("GET", f"users/{ALICE}")[1] or {})
             .get("servers", {}).get("", {}).get("ready"), timeout=180)
        token = hub.token(ALICE, [ACCESS, f"access:servers!user={ALICE}"])
        _a_named_servers_clients_end_with_it_while_her_default_server_runs(hub, fake, panel_token, wait, pending)
        base = f"{hub.url}/user/{ALICE}/api/"

        def api(verb: str, path: str, body: dict | None = None):
            req = urllib.request.Request(base + path, method=verb, data=json.dumps(body).encode() if body else None,
                                         headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                raw = resp.read()
                return json.loads(raw) if raw else None

        # two sessions, one notebook name (JupyterLab names a notebook's console session the same way)
        k1 = api("POST", "sessions", {"path": "one.ipynb", "type": "notebook", "name": "same.ipynb",
                                      "kernel": {"name": "python3"}})["kernel"]["id"]
        k2 = api("POST", "sessions", {"path": "two.ipynb", "type": "notebook", "name": "same.ipynb",
                                      "kernel": {"name": "python3"}})["kernel"]["id"]
        k3 = api("POST", "kernels", {"name": "python3"})["id"]  # no session: no notebook path at all
        ws = {k: f"ws://127.0.0.1:{hub.port}/user/{ALICE}/api/kernels/{k}/channels" for k in (k1, k2, k3)}
        origins = {}
        for k in (k1, k2, k3):
            [out] = _ws_execute(ws[k], token, ["%load_ext relay_jupyter\ng = relay.connect(['*'])\n"
                                               "print('ORIGIN', g['origin'])"])
            origins[k] = next(line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("ORIGIN "))
        assert origins[k1] == origins[k2] and origins[k1].endswith("same.ipynb"), origins
        assert origins[k3].startswith(f"user:{ALICE}/notebook:anon-"), origins
        # what the service scopes a kernel's client by: the hub's answer about the token the thin server gave the kernel
        # (her server's own, c.Spawner.server_token_scopes) names exactly that server, her default one
        [out] = _ws_execute(ws[k1], token, [
            "import json, os, urllib.request\n"
            "req = urllib.request.Request(os.environ['JUPYTERHUB_API_URL'].rstrip('/') + '/user',\n"
            "                             headers={'Authorization': 'token ' + os.environ['RELAY_TOKEN']})\n"
            "model = json.load(urllib.request.urlopen(req, timeout=30))\n"
            "print('SERVERS', json.dumps(sorted(s for s in model['scopes'] if s.startswith('access:servers'))))"])
        scopes = json.loads(next(line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("SERVERS ")))
        assert scopes == [f"access:servers!server={ALICE}/"], out
        assert token_server({"scopes": scopes}, ALICE) == ""

        def agent(k: str, chat: str, name: str) -> dict:
            before = pending()
            fake.enqueue(Reply(text("I will write."), tool_use("run_code", {"code": f"open('{name}', 'w').write('x')"})))
            cell = _Cell(ws[k], token, f"%%agent --chat {chat}\nwrite {name}").start()
            try:
                return new_card(before)
            except AssertionError:
                raise AssertionError(f"no card from {chat}: the cell shows {cell.text!r}; runs "
                                     f"{_panel(hub, panel_token, 'runs.list', {})}; fake requests "
                                     f"{len(fake.requests)}") from None

        # (a) the anonymous kernel: its shutdown reaches the service under the name the thin server gave it
        card3 = agent(k3, "c3", "anon.txt")
        assert card3["origin"] == origins[k3]
        api("DELETE", f"kernels/{k3}")
        cancelled("the anonymous kernel's run was not cancelled", card3)
        assert card3["request_id"] not in pending()

        # (c) one notebook name, two kernels: ending the first ends its run only
        card2 = agent(k2, "c2", "second.txt")
        card1 = agent(k1, "c1", "first.txt")
        assert card1["origin"] == card2["origin"] and card1["originator"] != card2["originator"]
        [s1] = [s for s in api("GET", "sessions") if s["kernel"]["id"] == k1]
        api("DELETE", f"sessions/{s1['id']}")  # shuts k1 down
        cancelled("the first kernel's run was not cancelled", card1)
        assert card1["request_id"] not in pending()
        assert card2["request_id"] in pending() and run_state(card2["run_id"]) == "running"

        # (b) the server SIGKILLed: no kernel.ended; the hub's poll deletes its token, the service notices
        [server_pid] = [pid for pid in pids_of(ALICE)
                        if b"jupyterhub-singleuser" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        os.kill(server_pid, signal.SIGKILL)
        cancelled("the killed server's kernel's run was not cancelled", card2)
        assert card2["request_id"] not in pending()
        late = _panel(hub, panel_token, "permission.answer", {"request_id": card2["request_id"], "decision": "allow"})
        assert late["error"]["data"]["code"] == "CONFLICT", late
        home = Path(f"/home/{ALICE}")
        assert not any((home / n).exists() for n in ("anon.txt", "first.txt", "second.txt"))
    finally:
        hub.hub_api("DELETE", f"users/{ALICE}/server")
        for pid in pids_of(ALICE):  # the killed server's kernels outlive it (orphans of this test)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def jp_asyncio_loop():
    """pytest-jupyter's autouse loop fixture would take (and close) the loop sync Playwright runs in
    (tests/kernel/test_browser.py); no test here starts an in-process Jupyter server."""
    yield None


@pytest.fixture
def jp_server_cleanup():
    yield None


CHROMIUM = "/usr/bin/chromium"
_CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.mark.browser
def test_a_browser_login_through_the_hub_clicks_a_consent_card_in_jupyterlab(hub, tokens, fake) -> None:
    """A person: logs in to the hub as alice (dummy authenticator), the hub spawns her JupyterLab (a thin client
    of the service), her notebook's %%agent asks to run code, she clicks Connect then Approve on the card: her
    kernel (her OS user) writes the file. Then her side panel (through her server's panel proxy,
    server/hub_panel_proxy.py): the next run's card is listed there, Approve in the panel completes the run, and
    bob's panel (his token as his server's proxy sends it, and his own JupyterLab in a second browser context, logged
    in through the hub while her card waits) lists none of it."""
    import os
    import pwd

    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    artifacts = Path(__file__).resolve().parents[2] / "artifacts"
    artifacts.mkdir(exist_ok=True)
    home = Path(pwd.getpwnam(ALICE).pw_dir)
    alice = pwd.getpwnam(ALICE)
    target = home / "hub-approve.txt"
    notebook = home / "hub-approve.ipynb"
    panel_target = home / "hub-panel.txt"
    cells = ["%load_ext relay_jupyter", "%%agent\nwrite hub-approve.txt", "%%agent\nwrite hub-panel.txt"]
    notebook.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": src} for i, src in enumerate(cells)],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))
    os.chown(notebook, alice.pw_uid, alice.pw_gid)
    fake.enqueue(Reply(text("I will write the file."),
                       tool_use("run_code", {"code": "open('hub-approve.txt', 'w').write('written through the hub')"})),
                 Reply(text("Finished with hub-approve.txt.")),
                 Reply(text("Writing through the panel."),
                       tool_use("run_code", {"code": "open('hub-panel.txt', 'w').write('approved in the panel')"})),
                 Reply(text("Finished with hub-panel.txt.")))
    # bob's server starts now, beside alice's login, so that his JupyterLab is there when her card is
    status, reply = hub.hub_api("POST", f"users/{BOB}/server")
    assert status in (201, 202), (status, reply)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=_CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            try:
                page.goto(f"{hub.url}/hub/login")
                page.fill("#username_input", ALICE)
                page.fill("#password_input", "any password: the dummy authenticator")
                page.click("#login_submit")
                # the hub spawns her server (LocalProcessSpawner as her OS user) and sends her on to it
                page.wait_for_url(f"**/user/{ALICE}/**", timeout=180_000)
                page.goto(f"{hub.url}/user/{ALICE}/lab/tree/hub-approve.ipynb?reset")
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
                idle = page.get_by_text("Python 3 (ipykernel) | Idle")
                for _ in range(240):
                    accept = page.locator(".jp-Dialog .jp-mod-accept")
                    if accept.count():
                        accept.first.click()
                    elif idle.count():
                        break
                    page.wait_for_timeout(250)
                page.locator(".jp-Cell").first.click()
                page.keyboard.press("Shift+Enter")
                page.keyboard.press("Shift+Enter")
                page.get_by_role("button", name="Connect", exact=True).click(timeout=60_000)
                approve = page.get_by_role("button", name="Approve", exact=True)
                approve.wait_for(timeout=60_000)
                page.screenshot(path=str(artifacts / "hub-card.png"), full_page=True)
                approve.click()
                page.get_by_text("Finished with hub-approve.txt.").wait_for(timeout=60_000)
                assert page.get_by_text("Approved by you (click)").count() >= 1
                # the side panel on the hub: the third cell's card is there, and Approve there completes the run
                page.locator(".jp-Cell").nth(2).locator(".jp-InputArea-editor").click()
                page.keyboard.press("Shift+Enter")
                panel = page.locator("#relay-jupyter-panel")
                assert HUB_LABEXTENSION.is_dir(), "the side panel is not built: make labext"
                page.locator('.jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id="relay-jupyter-panel"]').click()
                panel.get_by_text("Connected to the relay broker.").wait_for(timeout=60_000)
                in_panel = panel.locator("button:visible", has_text="Approve")
                in_panel.first.wait_for(timeout=60_000)
                bobs = _panel(hub, tokens[BOB], "permission.pending")["result"]["requests"]
                alices = _panel(hub, tokens[ALICE], "permission.pending")["result"]["requests"]
                assert len(alices) == 1 and alices[0]["origin"].startswith(f"user:{ALICE}/"), alices
                assert all(r["request_id"] != alices[0]["request_id"] and not r["origin"].startswith(f"user:{ALICE}/")
                           for r in bobs), bobs  # bob's panel does not see her card
                # bob, logged in in a browser of his own while her card waits: his JupyterLab's panel, once it has
                # its snapshot ("Connected" is shown after the cards are drawn), lists no card and nothing of hers
                bob = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
                try:
                    bob.goto(f"{hub.url}/hub/login")
                    bob.fill("#username_input", BOB)
                    bob.fill("#password_input", "any password: the dummy authenticator")
                    bob.click("#login_submit")
                    bob.wait_for_url(f"**/user/{BOB}/**", timeout=180_000)
                    bob.goto(f"{hub.url}/user/{BOB}/lab?reset")
                    bob.locator('.jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id="relay-jupyter-panel"]').click(
                        timeout=120_000)
                    bob_panel = bob.locator("#relay-jupyter-panel")
                    bob_panel.get_by_text("Connected to the relay broker.").wait_for(timeout=60_000)
                    bob.screenshot(path=str(artifacts / "hub-bob-panel.png"), full_page=True)
                    assert bob_panel.get_by_text("Nothing is waiting for approval.").count() == 1
                    assert bob_panel.locator("button:visible", has_text="Approve").count() == 0
                    assert ALICE not in bob_panel.inner_text()
                    assert alices[0]["request_id"] in {r["request_id"] for r in _panel(
                        hub, tokens[ALICE], "permission.pending")["result"]["requests"]}  # still hers, still open
                finally:
                    bob.context.close()
                page.screenshot(path=str(artifacts / "hub-panel-card.png"), full_page=True)
                in_panel.first.click()
                page.get_by_text("Finished with hub-panel.txt.").wait_for(timeout=60_000)
                assert _panel(hub, tokens[ALICE], "permission.pending")["result"]["requests"] == []
            finally:
                page.screenshot(path=str(artifacts / "hub-after.png"), full_page=True)
                browser.close()
        assert target.read_text() == "written through the hub"
        assert target.stat().st_uid == alice.pw_uid  # written by her kernel, as her
        assert panel_target.read_text() == "approved in the panel" and panel_target.stat().st_uid == alice.pw_uid
    finally:
        hub.hub_api("DELETE", f"users/{ALICE}/server")
        hub.hub_api("DELETE", f"users/{BOB}/server")


def test_alices_panel_through_her_server_sees_and_answers_only_her_own(hub, tokens, fake, tmp_path: Path) -> None:
    """(Before the last test, which leaves alice's and bob's team "race" spent.) The side panel on a hub (issue 15
    items 3 and 4): alice's thin server passes relay/rpc and relay/events on to
    the service with her hub token; with her Jupyter auth she lists only her origins' grants, runs, audit, telemetry,
    trust and pending permissions, answers and cancels her own, cannot answer, cancel, revoke or kill bob's, and
    sees none of bob's events live or in replay (tests/hub/panel_attack.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))
    from real_server import TOKEN, RealServer

    from .panel_attack import attack

    class Thin(RealServer):
        def env(self) -> dict[str, str]:
            env = super().env()
            env.update(JUPYTERHUB_API_TOKEN=tokens[ALICE], JUPYTERHUB_USER=ALICE)
            return env

    with Thin(tmp_path, {"hub_service_url": f"{hub.url}/services/{SERVICE}/"}) as srv:
        attack(hub, srv, TOKEN, ALICE, BOB, tokens, fake)


def test_concurrent_runs_of_two_users_never_overspend_their_hub_groups_team(hub, tokens, fake) -> None:
    """Last in the module (it leaves the team "race" spent). The admin sets the team's limit from the terminal as
    the service's user (jupyter relay budget set --team); then 8 runs of alice and bob at once: exactly what the
    limit holds is done, the others end budget_exhausted naming the team, and the team's ledger never passes the
    limit."""
    import threading

    names = [f"kernel:race-{who[7]}{i}.ipynb" for who in (ALICE, BOB) for i in range(4)]
    for name, who in zip(names, [ALICE] * 4 + [BOB] * 4):
        _grant(hub, tokens[who], client=name)
    # what one request reserves here: reported usage beyond the reservation is clamped to it
    _grant(hub, tokens[ALICE], client="kernel:race-p0.ipynb")
    before = hub.rpc(tokens[ALICE], "budget.get", {})["result"]["usage"]["teams"]
    fake.enqueue(Reply(text("probe"), usage=Usage(input_tokens=10**8, output_tokens=5)))
    assert _run(hub, tokens[ALICE], "race question", client="kernel:race-p0.ipynb")["state"] == "done"
    after = hub.rpc(tokens[ALICE], "budget.get", {})["result"]["usage"]["teams"]
    reserve = next(t["day"]["tokens"] for t in after if t["team"] == "ml") - \
        next(t["day"]["tokens"] for t in before if t["team"] == "ml")
    assert reserve > 100
    limit = 3 * reserve + reserve // 2
    out = service_cli(hub, "budget", "set", "--team", "race", "--tokens-per-day", str(limit))
    assert out.returncode == 0, out.stderr
    fake.enqueue(*[Reply(text(f"answer {i}"), usage=Usage(input_tokens=10**8, output_tokens=5)) for i in range(3)])
    results: dict[str, dict] = {}

    def one(name: str, who: str) -> None:
        results[name] = _run(hub, tokens[who], "race question", client=name)

    threads = [threading.Thread(target=one, args=(n, w)) for n, w in zip(names, [ALICE] * 4 + [BOB] * 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    states = sorted(r["state"] for r in results.values())
    assert len(results) == 8 and states.count("done") == 3 and states.count("budget_exhausted") == 5, results
    [race] = [t for t in hub.rpc(tokens[BOB], "budget.get", {})["result"]["usage"]["teams"] if t["team"] == "race"]
    # three whole reservations (a notebook name of the same length as the probe's: the same request size)
    assert race["day"]["tokens"] <= limit and abs(race["day"]["tokens"] - 3 * reserve) <= 30, (race, reserve)
    assert race["day"]["tokens_limit"] == limit
    assert race["day"]["reserved_tokens"] == 0

