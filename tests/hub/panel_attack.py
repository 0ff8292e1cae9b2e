"""alice's side panel on the hub, attacked over HTTP (issue 15 items 3 and 4; the test is
``test_hub_service.py::test_alices_panel_through_her_server_sees_and_answers_only_her_own``, sharing that module's
hub): her thin server's ``relay/rpc`` and ``relay/events``, with her Jupyter auth, passed on to the service with
her hub token (server/hub_panel_proxy.py) as a caller of kind ``panel`` for ``user:<alice>/…`` only.

Bob's grant, run and pending permission exist at the same time in the same service (he has the same notebook
name, so only the user part of the origin tells them apart)."""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .hub_rig import Hub

NOTEBOOK = "panel.ipynb"
CLIENT = f"kernel:{NOTEBOOK}"


class Panel:
    """What the side panel's TypeScript does against its own server: POST relay/rpc, GET relay/events."""

    def __init__(self, base_url: str, jupyter_token: str) -> None:
        self.base = base_url
        self.token = jupyter_token

    def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode()
        req = urllib.request.Request(self.base + "relay/rpc", data=body, method="POST",
                                     headers={"Authorization": f"token {self.token}", "X-Relay-Client": "panel",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def result(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = self.rpc(method, params)
        assert "result" in reply, (method, reply)
        return reply["result"]

    def refused(self, method: str, params: dict[str, Any]) -> str:
        reply = self.rpc(method, params)
        assert "error" in reply, (method, params, reply)
        return str(reply["error"].get("data", {}).get("code"))

    def events(self, since: int | None = None) -> Stream:
        return Stream(self.base + "relay/events" + (f"?since={since}" if since is not None else ""), self.token)


class Stream:
    """An SSE stream read in a thread; events (their JSON data lines) go to a queue."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        self.conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                          headers={"Authorization": f"token {token}", "Accept": "text/event-stream"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200, (self.response.status, self.response.read()[:300])
        assert self.response.getheader("Content-Type", "").startswith("text/event-stream")
        self.got: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for raw in self.response:
                line = raw.decode().rstrip("\n")
                if line.startswith("data: "):
                    self.got.put(json.loads(line[len("data: "):]))
        except Exception:  # noqa: BLE001 - the stream closed under the reader (close()): the reader's end
            return

    def until(self, pred, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"not seen; got {[(e.get('type'), e.get('origin')) for e in self.seen][-20:]}"
            try:
                event = self.got.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(event)
            if pred(event):
                return event

    def close(self) -> None:
        self.conn.close()


def _subscribers(hub: Hub, token: str) -> int:
    """The service's live SSE subscribers (its Prometheus gauge)."""
    status, raw = hub.request("metrics", token=token, via_proxy=False)
    assert status == 200, (status, raw[:200])
    [line] = [x for x in raw.decode().splitlines() if x.startswith("relay_sse_subscribers ")]
    return int(float(line.split()[1]))


def _pending(hub: Hub, token: str, client: str, run_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not (pending := hub.rpc(token, "permission.pending", {}, client=client)["result"]["requests"]):
        assert time.monotonic() < deadline, ("no consent card", hub.rpc(token, "runs.get", {"run_id": run_id},
                                                                        client=client))
        time.sleep(0.2)  # the run reaching its card in the service process
    [card] = pending
    return card


def attack(hub: Hub, srv: Any, jupyter_token: str, alice: str, bob: str, tokens: dict[str, str],
           fake: FakeAnthropic) -> None:
    mine, theirs = f"user:{alice}/", f"user:{bob}/"
    panel = Panel(srv.url, jupyter_token)
    # no Jupyter auth, a kernel's scheme, or a token in the URL: the proxy is Jupyter's, it refuses them all
    for headers in ({}, {"Authorization": "RelayKernel rk1.x.y"}, {"Authorization": "token wrong"}):
        req = urllib.request.Request(srv.url + "relay/rpc", method="POST", headers=headers,
                                     data=b'{"jsonrpc": "2.0", "id": 1, "method": "grants.list", "params": {}}')
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raise AssertionError(f"the panel proxy answered {resp.status} without Jupyter auth: {headers}")
        except urllib.error.HTTPError as exc:
            assert exc.code in (401, 403), (headers, exc.code)
    baseline = _subscribers(hub, tokens[alice])  # the service's streams before alice's panel opens two
    live = panel.events()  # from now on, live
    bob_run_id = None
    try:
        for who in (bob, alice):  # the same notebook name for both: only the user tells them apart
            grant = hub.rpc(tokens[who], "grants.create", {"tools": ["*"], "models": ["*"]}, client=CLIENT)
            assert grant["result"]["grant"]["origin"] == f"user:{who}/notebook:{NOTEBOOK}", grant
        fake.enqueue(Reply(text("bob writes"), tool_use("run_code", {"code": "open('bob.txt', 'w').write('b')"})))
        bob_run = hub.rpc(tokens[bob], "run.start", {"conversation": "p", "prompt": "write"}, client=CLIENT)
        bob_run_id = bob_run["result"]["run_id"]
        bob_card = _pending(hub, tokens[bob], CLIENT, bob_run_id)
        fake.enqueue(Reply(text("alice writes"), tool_use("run_code", {"code": "open('a.txt', 'w').write('a')"})))
        alice_run = hub.rpc(tokens[alice], "run.start", {"conversation": "p", "prompt": "write"}, client=CLIENT)
        alice_card = _pending(hub, tokens[alice], CLIENT, alice_run["result"]["run_id"])
        alice_run_id = alice_run["result"]["run_id"]

        # what the panel lists: her origins' rows only, and they are there (not an empty answer)
        grants = panel.result("grants.list")["grants"]
        assert grants and all(g["origin"].startswith(mine) for g in grants), grants
        assert f"{mine}notebook:{NOTEBOOK}" in {g["origin"] for g in grants}
        runs = panel.result("runs.list", {"limit": 200})["runs"]
        assert alice_run_id in {r["run_id"] for r in runs} and all(r["origin"].startswith(mine) for r in runs), runs
        audit = panel.result("audit.tail", {"n": 500})["records"]
        assert audit and all(r["origin"].startswith(mine) for r in audit), [r["origin"] for r in audit]
        for method, key in (("telemetry.query", "rows"), ("trust.list", "trust")):
            rows = panel.result(method)[key]
            assert all(r["origin"].startswith(mine) for r in rows), (method, rows)
        pending = panel.result("permission.pending")["requests"]
        assert [p["request_id"] for p in pending] == [alice_card["request_id"]], pending

        # bob's: not seen, not answered, not cancelled, not revoked, not killed
        bob_origin = f"{theirs}notebook:{NOTEBOOK}"
        assert panel.refused("permission.answer", {"request_id": bob_card["request_id"], "decision": "allow"}) \
            == "NOT_ORIGINATOR"
        assert panel.refused("permission.answer", {"request_id": bob_card["request_id"], "decision": "deny"}) \
            == "NOT_ORIGINATOR"
        for method in ("runs.cancel", "run.cancel", "runs.get"):
            assert panel.refused(method, {"run_id": bob_run_id}) == "NOT_FOUND", method
        for method, params in (("grants.revoke", {"origin": bob_origin}), ("grants.get", {"origin": bob_origin}),
                               ("budget.get", {"origin": bob_origin}), ("audit.tail", {"origin": bob_origin}),
                               ("runs.list", {"origin": bob_origin}), ("trust.revoke", {"origin": bob_origin}),
                               ("kill", {"origin": bob_origin}), ("kill", {"all": True}),
                               ("grants.create", {"tools": ["*"], "models": ["*"], "origin": bob_origin}),
                               ("kernel.ended", {"reason": "shut down"})):
            assert panel.refused(method, params) == "UNAUTHORIZED", (method, params)
        assert hub.rpc(tokens[bob], "permission.pending", {}, client=CLIENT)["result"]["requests"] == [bob_card]
        assert hub.rpc(tokens[bob], "runs.get", {"run_id": bob_run_id}, client=CLIENT)["result"]["run"]["state"] \
            == "running"
        assert hub.rpc(tokens[bob], "grants.get", {}, client=CLIENT)["result"]["grant"] is not None

        # her own card: answered through the panel (what the card's button does), her run cancelled through it
        answer = panel.result("permission.answer", {"request_id": alice_card["request_id"], "decision": "deny"})
        assert answer["decision"] == "deny" and answer["answered_by"] == f"user:{alice}/#panel:panel", answer
        resolved = live.until(lambda e: e.get("type") == "permission.resolved"
                              and e["data"].get("request_id") == alice_card["request_id"])
        assert resolved["origin"] == f"{mine}notebook:{NOTEBOOK}"
        panel.result("runs.cancel", {"run_id": alice_run_id})
        live.until(lambda e: e.get("run_id") == alice_run_id and e.get("type") in
                   ("run.done", "run.cancelled", "run.error", "run.interrupted"))
        # live: bob's events happened on this stream's watch (his card came first) and none reached it
        origins = [e.get("origin") for e in live.seen]
        assert f"{mine}notebook:{NOTEBOOK}" in origins and all(o is None or o.startswith(mine) for o in origins), \
            origins
        ids = [e["id"] for e in live.seen if e.get("id") is not None]
        assert bob_card["event_id"] < max(ids) and bob_card["event_id"] not in ids, (bob_card["event_id"], ids)
    finally:
        live.close()
        if bob_run_id is not None:  # bob's own client ends his run
            hub.rpc(tokens[bob], "run.cancel", {"run_id": bob_run_id}, client=CLIENT)

    # replay from the start: every event of hers, none of bob's (bob's card event is in the store)
    replay = panel.events(since=0)
    try:
        replay.until(lambda e: e.get("data", {}).get("request_id") == alice_card["request_id"]
                     and e.get("type") == "permission.resolved")
        origins = {e.get("origin") for e in replay.seen}
        assert all(o is None or o.startswith(mine) for o in origins), origins
        assert alice_card["event_id"] in {e.get("id") for e in replay.seen}
        assert bob_card["event_id"] not in {e.get("id") for e in replay.seen}
    finally:
        replay.close()
    # the browser's streams gone: so are the service's (at its next heartbeat at the latest), nothing left open
    deadline = time.monotonic() + 60
    while (now := _subscribers(hub, tokens[alice])) > baseline:  # (an earlier test's stream may end meanwhile)
        assert time.monotonic() < deadline, (now, baseline)
        time.sleep(0.5)  # the proxy ends the service's stream when it next writes to the gone browser
    # a bad `since` comes back as the service's one-line 400, not a stream
    try:
        urllib.request.urlopen(urllib.request.Request(srv.url + "relay/events?since=x",
                                                      headers={"Authorization": f"token {jupyter_token}"}), timeout=30)
        raise AssertionError("a bad since was streamed")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400 and b"\n" not in exc.read().strip()
    assert not (Path(srv.root) / "a.txt").exists()
