"""Kernel clients are scoped to the single-user server their token belongs to (issue 15, kernel lifetime on a hub),
without a hub: the service's real gate (``HubGate``) and endpoints (``make_app``) on 127.0.0.1, an in-memory broker,
the shipped FakeAnthropic, a stand-in for ``HubAuth`` (the token models JupyterHub 6's ``GET /hub/api/user``
answers: a server's own token holds ``access:servers!server=<user>/<server>``) and a stand-in hub REST API for
``GET /hub/api/users/<name>`` (``servers``: name -> model with ``started``). The same sweep on a real hub:
``tests/hub/test_hub_service.py``.

- a client of a named server is ended when that server is gone while the user's default server runs (before: any
  server of hers kept every client), the default server's client stays;
- a client ended within its first check (never seen while its server was there: before, never ended, so its card
  waited the consent timeout), and one left over by a server restarted under the same name (its ``started`` is
  after the client first came);
- an ended kernel instance is refused from then on (410) on the RPC and on the model endpoint its SDK client
  uses, whose requests carry the instance (``kernel/sdk_clients.py``); an SDK stream still open is cut and settles;
- a personal token (no server named) keeps the old rule; a hub that does not answer withdraws nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.core.types import ConsentDecision, ConsentRequest, ToolClass, ToolRequest, ToolSpec
from relay_jupyter.server.hub_service import (HubGate, HubServersUnavailable, KernelClients, OpenRequests,
                                              end_kernels_of_gone_servers, token_server)
from relay_jupyter.server.plain import make_app
from relay_jupyter.testing import FakeAnthropic, Reply, text

pytest.importorskip("jupyterhub", reason="jupyterhub is not installed (pip install -e '.[test]')")

ACCESS = "access:services!service=relay"
PREFIX = "/services/relay/relay/"
KEY = "sk-ant-scope-test-0123456789abcdef"
ALICE = "alice"
#: alice's tokens as the hub describes them: her default server's, her named server "gpu"'s and "lab"'s, a
#: personal one (``self``: no server), and bob's, who was given a share of her default server
TOKENS: dict[str, dict[str, Any]] = {
    "tok-main": {"name": ALICE, "scopes": [ACCESS, f"access:servers!server={ALICE}/", "users:activity!user=alice"]},
    "tok-gpu": {"name": ALICE, "scopes": [ACCESS, f"access:servers!server={ALICE}/gpu"]},
    "tok-lab": {"name": ALICE, "scopes": [ACCESS, f"access:servers!server={ALICE}/lab"]},
    "tok-personal": {"name": ALICE, "scopes": [ACCESS, f"access:servers!user={ALICE}", "read:users!user=alice"]},
}
INST = {name: f"{i:016x}" for i, name in enumerate(("main", "gpu", "old", "personal", "lab", "gpu2"), start=1)}


def test_a_token_names_its_server_only_when_it_holds_exactly_one_of_its_users() -> None:
    assert token_server(TOKENS["tok-main"], ALICE) == ""
    assert token_server(TOKENS["tok-gpu"], ALICE) == "gpu"
    assert token_server(TOKENS["tok-personal"], ALICE) is None
    both = {"scopes": [f"access:servers!server={ALICE}/", f"access:servers!server={ALICE}/gpu"]}
    assert token_server(both, ALICE) is None  # several: which one is unknown
    shared = {"scopes": [f"access:servers!server=bob/", f"access:servers!user={ALICE}"]}
    assert token_server(shared, ALICE) is None  # another user's server shared with her is not hers
    assert token_server({"scopes": "access:servers!server=alice/"}, ALICE) is None
    assert token_server({}, ALICE) is None


class _Auth:
    """``HubAuth.user_for_token`` as the service calls it: the token's model, or None for a wrong token."""

    async def user_for_token(self, token: str, sync: bool = False) -> dict[str, Any] | None:
        model = TOKENS.get(token)
        return {"kind": "user", "groups": [], **model} if model else None


class _HubApi:
    """``GET /hub/api/users/<name>``: the servers the test says the user has (``None``: answer 403)."""

    def __init__(self) -> None:
        self.servers: dict[str, dict[str, Any]] | None = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if outer.servers is None:
                    self.send_response(403)
                    self.end_headers()
                    return
                body = json.dumps({"name": ALICE, "servers": outer.servers}).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hub/api"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).replace(tzinfo=None).isoformat() + "Z"  # as the hub writes it


@pytest_asyncio.fixture
async def served():
    with FakeAnthropic(api_key=KEY) as fake:
        broker = Broker.open(BrokerConfig(in_memory=True, anthropic_base_url=fake.base_url, anthropic_api_key=KEY,
                                          default_model="claude-test-1"))
        gate = HubGate(_Auth(), ACCESS)
        now = [1000.0]
        gate.kernel_clients = KernelClients(clock=lambda: now[0])
        requests = OpenRequests()
        server = make_app(broker, gate, prefix=PREFIX, activity=requests).listen(0, "127.0.0.1")
        port = next(iter(server._sockets.values())).getsockname()[1]
        hub = _HubApi()
        try:
            yield SimpleNamespace(broker=broker, gate=gate, requests=requests, port=port, hub=hub, now=now, fake=fake)
        finally:
            hub.close()
            server.stop()
            await server.close_all_connections()
            broker.close()


def _headers(token: str, client: str, instance: str | None) -> bytes:
    lines = [f"Authorization: token {token}", f"X-Relay-Client: {client}"]
    if instance:
        lines.append(f"X-Relay-Instance: {instance}")
    return ("\r\n".join(lines) + "\r\n").encode()


async def _post(port: int, path: str, token: str, client: str, instance: str | None, msg: dict) -> tuple[int, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(msg).encode()
    writer.write(f"POST {PREFIX}{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
                 + _headers(token, client, instance) + b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(payload or b"{}")


async def _rpc(s, token: str, client: str, instance: str | None, method: str, params: dict | None = None
               ) -> tuple[int, dict]:
    return await _post(s.port, "rpc", token, client, instance,
                       {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})


def _ask(broker: Broker, client_id: str, origin: str, rid: str) -> asyncio.Task:
    req = ToolRequest(origin=origin, tool=ToolSpec(name="run_code", tool_class=ToolClass.WRITE, runs_code=True),
                      arguments={"code": "open('x', 'w')"}, call_id="c1", run_id=None, originator=client_id)
    return asyncio.ensure_future(broker.permissions.ask(
        ConsentRequest(request_id=rid, request=req, deadline=time.time() + 60)))


async def _until_pending(broker: Broker, n: int) -> None:
    async with asyncio.timeout(5):
        while len(broker.permissions.pending_originators()) < n:
            await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_named_servers_kernels_end_with_it_and_its_instances_are_refused_after(served) -> None:
    s = served
    ids = {}
    # first seen at 1000: the kernel of the default server that was running before it was restarted at 1500
    status, _ = await _rpc(s, "tok-main", "kernel:old.ipynb", INST["old"], "permission.pending")
    assert status == 200
    s.now[0] = 2000.0
    for name, token in (("main", "tok-main"), ("gpu", "tok-gpu"), ("personal", "tok-personal")):
        status, reply = await _rpc(s, token, f"kernel:{name}.ipynb", INST[name], "permission.pending")
        assert status == 200 and "result" in reply, reply
    for name in ("main", "gpu", "old", "personal"):
        ids[name] = f"user:{ALICE}/kernel:{name}.ipynb#{INST[name]}"
    asks = {n: _ask(s.broker, ids[n], f"user:{ALICE}/notebook:{n}.ipynb", f"pr_{n}") for n in ids}
    await _until_pending(s.broker, 4)

    # the hub lists her default server only, (re)started at 1500; "gpu" is gone (killed within its first check)
    s.hub.servers = {"": {"name": "", "ready": True, "started": _iso(1500.0)}}
    ended = await end_kernels_of_gone_servers(s.broker, s.gate, s.hub.url, "svc-token", s.requests)
    assert set(ended) == {ids["gpu"], ids["old"]}, ended
    for name in ("gpu", "old"):
        result = await asyncio.wait_for(asks[name], 5)
        assert result.decision is ConsentDecision.DENY and result.answered_by == "withdrawn:lost its server"
        assert ended[ids[name]]["withdrawn"] == [f"pr_{name}"]
    assert s.broker.permissions.pending_originators() == {ids["main"], ids["personal"]}
    assert s.gate.kernel_clients.bound(ids["personal"])  # a personal token: bound to her having a server

    # the ended instances are refused on the RPC and on the model endpoint (an SDK client's request); a new kernel
    # instance of the same token is another client, and the default server's client goes on
    for name, token in (("gpu", "tok-gpu"), ("old", "tok-main")):
        status, reply = await _rpc(s, token, f"kernel:{name}.ipynb", INST[name], "permission.pending")
        assert status == 410 and "server is gone" in reply["message"], (status, reply)
        status, reply = await _post(s.port, "anthropic/v1/messages", token, f"kernel:{name}.ipynb", INST[name],
                                    {"model": "claude-test-1", "max_tokens": 10,
                                     "messages": [{"role": "user", "content": "hi"}]})
        assert status == 410, (status, reply)
    assert (await _rpc(s, "tok-gpu", "kernel:gpu.ipynb", INST["gpu2"], "permission.pending"))[0] == 200
    assert (await _rpc(s, "tok-main", "kernel:main.ipynb", INST["main"], "permission.pending"))[0] == 200

    # a card of an ended instance that got past the gate before it ended: the next sweep withdraws it without asking
    # the hub (here one that refuses the service: no read:servers), and withdraws nothing else
    late = _ask(s.broker, ids["gpu"], f"user:{ALICE}/notebook:gpu.ipynb", "pr_late")
    await _until_pending(s.broker, 3)
    s.hub.servers = None
    with pytest.raises(HubServersUnavailable):
        await end_kernels_of_gone_servers(s.broker, s.gate, s.hub.url, "svc-token", s.requests)
    assert (await asyncio.wait_for(late, 5)).decision is ConsentDecision.DENY
    assert s.broker.permissions.pending_originators() == {ids["main"], ids["personal"]}

    # no server left: the default server's client and the bound personal one end too
    s.hub.servers = {}
    ended = await end_kernels_of_gone_servers(s.broker, s.gate, s.hub.url, "svc-token", s.requests)
    assert set(ended) == {ids["main"], ids["personal"]}, ended
    assert s.broker.permissions.pending_originators() == set()
    for name in ("main", "personal"):
        assert (await asyncio.wait_for(asks[name], 5)).decision is ConsentDecision.DENY
    # the personal token's client is not refused later (it may be a script of hers, not a kernel of that server)
    assert (await _rpc(s, "tok-personal", "kernel:personal.ipynb", INST["personal"], "permission.pending"))[0] == 200


@pytest.mark.asyncio
async def test_an_sdk_stream_of_a_kernel_whose_server_is_gone_is_cut_and_settles(served) -> None:
    s = served
    client, instance = "kernel:lab.ipynb", INST["lab"]
    origin = f"user:{ALICE}/notebook:lab.ipynb"
    status, reply = await _rpc(s, "tok-lab", client, instance, "grants.create", {"tools": ["*"], "models": ["*"]})
    assert status == 200 and "result" in reply, reply
    s.hub.servers = {"lab": {"name": "lab", "ready": True, "started": _iso(500.0)}}
    s.fake.enqueue(Reply(text(" ".join(["word"] * 400)), tokens_per_second=20))
    reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
    body = json.dumps({"model": "claude-test-1", "max_tokens": 2000, "stream": True,
                       "messages": [{"role": "user", "content": "a long answer"}]}).encode()
    writer.write(f"POST {PREFIX}anthropic/v1/messages HTTP/1.1\r\nHost: x\r\n".encode()
                 + f"x-api-key: tok-lab\r\nX-Relay-Client: {client}\r\nX-Relay-Instance: {instance}\r\n".encode()
                 + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    seen = b""
    async with asyncio.timeout(20):
        while b"content_block_delta" not in seen:
            seen += await reader.read(4096)
    client_id = f"user:{ALICE}/{client}#{instance}"
    assert s.requests.model_clients() == {client_id}  # the open SDK stream makes the client live: it is checked
    assert s.broker.ledger.usage(origin)["reserved_tokens"] > 0
    # its server still there: nothing happens to the stream
    assert await end_kernels_of_gone_servers(s.broker, s.gate, s.hub.url, "svc-token", s.requests) == {}
    s.hub.servers = {}
    ended = await end_kernels_of_gone_servers(s.broker, s.gate, s.hub.url, "svc-token", s.requests)
    assert ended[client_id]["closed_requests"] == 1, ended
    async with asyncio.timeout(20):
        while chunk := await reader.read(4096):
            seen += chunk
    writer.close()
    assert b"message_stop" not in seen  # cut, not answered to its end
    async with asyncio.timeout(20):  # the endpoint settles what the cut stream used: nothing stays held
        while s.broker.ledger.usage(origin)["reserved_tokens"]:
            await asyncio.sleep(0.05)
    assert s.requests.model_clients() == set()


def test_the_kernels_sdk_clients_send_its_instance_id(monkeypatch) -> None:
    """``relay.anthropic()`` / ``relay.openai()`` / the endpoint target carry the kernel's instance id, as its RPC
    client does: the service's client id of an SDK request is the kernel's (the sweep above finds it)."""
    from relay_jupyter.kernel.sdk_clients import endpoint_target  # what relay.anthropic() / relay.openai() use

    endpoint = SimpleNamespace(auth="Bearer tok", client_name="kernel:a.ipynb", url="http://hub/services/relay/relay/")
    monkeypatch.delenv("RELAY_KERNEL_INSTANCE", raising=False)
    assert "X-Relay-Instance" not in endpoint_target(endpoint)[2]
    monkeypatch.setenv("RELAY_KERNEL_INSTANCE", "not-an-instance")  # malformed: not sent (the service refuses it)
    assert "X-Relay-Instance" not in endpoint_target(endpoint)[2]
    monkeypatch.setenv("RELAY_KERNEL_INSTANCE", INST["gpu"])
    for wire in ("anthropic", "openai/v1"):
        base, key, headers, sock = endpoint_target(endpoint, wire)
        assert headers == {"X-Relay-Client": "kernel:a.ipynb", "X-Relay-Instance": INST["gpu"]}
        assert (base, key, sock) == (f"http://hub/services/relay/relay/{wire}", "tok", None)


@pytest.mark.asyncio
async def test_a_kernel_that_died_and_was_restarted_is_told_again_when_it_ends() -> None:
    """The thin server keeps a kernel's name after ``died`` (the restarter starts it again with the same
    environment, the same instance id) and after ``restarted``; only ``shut down`` forgets it. Each end is told."""
    from relay_jupyter.server.hub_service import ThinKernels

    told: list[tuple[str, str, str | None]] = []
    kernels = ThinKernels("http://127.0.0.1:1/services/relay/", lambda: None)

    async def tell(client_name: str, reason: str, *, instance: str | None = None) -> None:
        told.append((client_name, reason, instance))

    kernels.tell = tell  # type: ignore[method-assign]
    kernels.started("k1", {"JPY_SESSION_NAME": "a.ipynb", "RELAY_KERNEL_INSTANCE": INST["main"]})
    for reason in ("died", "restarted", "died", "shut down", "died"):
        kernels.ended("k1", reason)
    await kernels.drain()
    assert told == [("kernel:a.ipynb", r, INST["main"]) for r in ("died", "restarted", "died", "shut down")]
    assert kernels.client_name("k1") is None
