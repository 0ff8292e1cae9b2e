"""On the hub service the notebook part of an origin is the kernel's own label (issue 11; docs/multi-user.md): the
user part comes from JupyterHub (``HubAuth``), the label from ``X-Relay-Client``. As an attacker holding alice's
token: no label alice can send reaches bob's origin, grant or budget, and no two (user, label) pairs share an
origin.

Real parts: jupyterhub's own ``HubAuth`` asking a hub API over HTTP (a small tornado app answering
``GET /hub/api/user`` per token, as the hub does), the service's ``HubGate`` and the daemon app (``make_app``)
over real HTTP, a real broker. No root, no hub processes: the full hub is tests/hub/test_hub_service.py."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from tornado import httpclient, web

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.server.daemon_auth import CLIENT_NAME
from relay_jupyter.server.hub_service import HubGate, hub_origin
from relay_jupyter.server.plain import make_app

SCOPE = "access:services!service=relay"
USERS = {"tok-alice": "alice", "tok-bob": "bob"}


class _HubUser(web.RequestHandler):
    """``GET /hub/api/user``: the model of the token's owner, as JupyterHub answers it (403 for an unknown one)."""

    def get(self) -> None:
        scheme, _, token = self.request.headers.get("Authorization", "").partition(" ")
        name = USERS.get(token.strip()) if scheme.lower() in ("token", "bearer") else None
        if name is None:
            raise web.HTTPError(403)
        self.finish({"kind": "user", "name": name, "scopes": [SCOPE], "groups": []})


@pytest_asyncio.fixture
async def service():
    from jupyterhub.services.auth import HubAuth

    hub = web.Application([(r"/hub/api/user", _HubUser)]).listen(0, "127.0.0.1")
    hub_port = next(iter(hub._sockets.values())).getsockname()[1]
    broker = Broker.open(BrokerConfig(in_memory=True))
    auth = HubAuth(api_token="service-token", api_url=f"http://127.0.0.1:{hub_port}/hub/api", cache_max_age=0)
    server = make_app(broker, HubGate(auth, SCOPE)).listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    yield broker, port
    server.stop()
    hub.stop()
    await server.close_all_connections()
    broker.close()


async def _rpc(port: int, token: str, client: str, method: str, params: dict[str, Any] | None = None) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})
    response = await httpclient.AsyncHTTPClient().fetch(
        f"http://127.0.0.1:{port}/relay/rpc", method="POST", body=body, raise_error=False,
        headers={"Authorization": f"token {token}", "X-Relay-Client": client, "Content-Type": "application/json"})
    return response.code, json.loads(response.body) if response.body else None


#: Labels alice might send to become bob, or bob's notebook: each is her own origin, or refused.
HOSTILE = ["kernel:nb.ipynb", "kernel:user:bob", "user:bob", "kernel:user:bob:notebook:nb.ipynb", "client:default",
           "kernel:..", "kernel:nb.ipynb:", "KERNEL:nb.ipynb", "kernel:user:bob/notebook:nb.ipynb",
           "kernel:nb.ipynb%2f..", "kernel:\u200bnb.ipynb", "kernel:nb.ipynb\r\nX-Relay-Client: kernel:x"]


@pytest.mark.asyncio
async def test_no_label_alice_sends_reaches_bobs_grant_or_budget(service) -> None:
    broker, port = service
    status, made = await _rpc(port, "tok-bob", "kernel:nb.ipynb", "grants.create",
                              {"tools": [], "models": ["*"], "budget": {"tokens_per_day": 1000}})
    assert status == 200 and made["result"]["grant"]["origin"] == "user:bob/notebook:nb.ipynb", made
    for label in HOSTILE:
        try:
            status, got = await _rpc(port, "tok-alice", label, "grants.get")
        except ValueError:  # a header tornado's client itself refuses to send (CR/LF): nothing reached the service
            continue
        if status == 400:
            continue  # not a client name at all
        assert status == 200, (label, status, got)
        assert got["result"]["grant"] is None, (label, got)
        status, budget = await _rpc(port, "tok-alice", label, "budget.get")
        assert budget["result"]["origin"].startswith("user:alice/"), (label, budget)
        assert budget["result"]["usage"]["tokens_limit"] != 1000, (label, budget)  # not bob's budget
        # naming bob's origin outright is refused
        status, named = await _rpc(port, "tok-alice", label, "grants.get", {"origin": "user:bob/notebook:nb.ipynb"})
        assert named["error"]["data"]["code"] == "UNAUTHORIZED", (label, named)
    # bob's own kernel still has its grant, untouched
    status, own = await _rpc(port, "tok-bob", "kernel:nb.ipynb", "grants.get")
    assert own["result"]["grant"]["origin"] == "user:bob/notebook:nb.ipynb"
    status, own_budget = await _rpc(port, "tok-bob", "kernel:nb.ipynb", "budget.get")
    assert own_budget["result"]["usage"]["tokens_limit"] == 1000, own_budget  # what alice never saw


_USER = st.text(alphabet=string.ascii_letters + string.digits + "-_.@:", min_size=1, max_size=12)
_CLIENT = st.text(alphabet=string.ascii_letters + string.digits + "_.:-", min_size=1, max_size=64)


@given(_USER, _CLIENT, _USER, _CLIENT)
def test_two_users_never_share_an_origin(u1: str, c1: str, u2: str, c2: str) -> None:
    # the gate refuses user names with "/" and client names outside [A-Za-z0-9_.:-]{1,64}
    assert CLIENT_NAME.match(c1) and CLIENT_NAME.match(c2)
    o1, o2 = hub_origin(u1, c1), hub_origin(u2, c2)
    assert o1.startswith(f"user:{u1}/") and "/" not in o1[len(f"user:{u1}/"):]
    if u1 != u2:
        assert o1 != o2
