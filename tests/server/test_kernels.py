"""Real kernels started through the server: own credential, no secrets, and two notebooks kept apart."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from tornado.httpclient import AsyncHTTPClient

from relay_jupyter.protocol.names import TERMINAL_EVENTS
from relay_jupyter.protocol.sse import parse_stream
from relay_jupyter.testing import FakeAnthropic, Reply, tool_use

pytestmark = pytest.mark.slow

SECRET = "sk-ant-api03-relaytestsecret-0123456789"

PROBE = r"""
import json, os, urllib.request
env = dict(os.environ)
req = urllib.request.Request(env["RELAY_URL"] + "rpc", method="POST",
    data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.get"}).encode(),
    headers={"Authorization": "RelayKernel " + env["RELAY_KERNEL_CREDENTIAL"], "Content-Type": "application/json"})
reply = json.loads(urllib.request.urlopen(req, timeout=10).read())
print(json.dumps({"env": env, "reply": reply}))
"""


async def run_in_kernel(serverapp, kernel_id, code):
    km = serverapp.kernel_manager.get_kernel(kernel_id)
    kc = km.client()
    kc.start_channels()
    out = []
    try:
        await kc.wait_for_ready(timeout=60)

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("ERROR " + "\n".join(msg["content"]["traceback"]))

        await kc.execute_interactive(code, output_hook=hook, timeout=60)
    finally:
        kc.stop_channels()
    return "".join(out)


async def start_session(jp_fetch, path):
    resp = await jp_fetch("api", "sessions", method="POST",
                          body=json.dumps({"path": path, "type": "notebook", "kernel": {"name": "python3"}}))
    return json.loads(resp.body)["kernel"]["id"]


async def test_kernels_get_credentials_not_secrets_and_stay_apart(jp_fetch, jp_serverapp, monkeypatch, rpc):
    token = jp_serverapp.identity_provider.token
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-relaytest-987654321")
    monkeypatch.setenv("COPIED_KEY", SECRET)          # a key copied under another name
    monkeypatch.setenv("JUPYTER_TOKEN", token)
    monkeypatch.setenv("SERVER_TOKEN_COPY", f"x{token}y")
    monkeypatch.setenv("HARMLESS", "keep-me")
    ka = await start_session(jp_fetch, "a.ipynb")
    kb = await start_session(jp_fetch, "sub/b.ipynb")
    try:
        probe_a = json.loads((await run_in_kernel(jp_serverapp, ka, PROBE)).strip().splitlines()[-1])
        probe_b = json.loads((await run_in_kernel(jp_serverapp, kb, PROBE)).strip().splitlines()[-1])
        for probe in (probe_a, probe_b):
            env = probe["env"]
            blob = json.dumps(env)
            for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "COPIED_KEY", "JUPYTER_TOKEN", "SERVER_TOKEN_COPY"):
                assert name not in env
            assert SECRET not in blob and token not in blob
            assert env["HARMLESS"] == "keep-me"
            assert env["RELAY_URL"].endswith("/relay/") and env["RELAY_URL"].startswith("http")
            assert len(env["RELAY_KERNEL_CREDENTIAL"]) >= 40
            assert probe["reply"] == {"jsonrpc": "2.0", "id": 1, "result": {"grant": None}}
        cred_a = {"Authorization": "RelayKernel " + probe_a["env"]["RELAY_KERNEL_CREDENTIAL"]}
        cred_b = {"Authorization": "RelayKernel " + probe_b["env"]["RELAY_KERNEL_CREDENTIAL"]}
        assert cred_a != cred_b

        # A's connect card grants A; B sees no grant and cannot touch A's
        created = await rpc("grants.create", {"tools": ["list_variables"]}, headers=cred_a)
        assert created["result"]["grant"]["origin"] == "notebook:a.ipynb"
        assert (await rpc("grants.get", {}, headers=cred_b))["result"]["grant"] is None
        stolen = await rpc("grants.get", {"origin": "notebook:a.ipynb"}, headers=cred_b)
        assert stolen["error"]["data"]["code"] == "UNAUTHORIZED"
        call_b = await rpc("tools.call", {"conversation": "c", "tool": "list_variables"}, headers=cred_b)
        assert call_b["error"]["data"]["code"] == "UNAUTHORIZED"
        # credential case variants are other credentials
        swapped = {"Authorization": "RelayKernel " + probe_a["env"]["RELAY_KERNEL_CREDENTIAL"].swapcase()}
        with pytest.raises(Exception) as exc:
            await rpc("grants.get", {}, headers=swapped)
        assert getattr(exc.value, "code", None) == 403

        # a permission request of A's run: B cannot answer it or see it
        broker = jp_serverapp.extension_manager.extension_points["relay_jupyter"].app.broker
        from relay_jupyter.core.types import ConsentRequest, ToolClass, ToolRequest, ToolSpec

        req = ToolRequest(origin="notebook:a.ipynb", tool=ToolSpec(name="run_code", tool_class=ToolClass.WRITE),
                          call_id="c1", run_id="r1", originator=f"kernel:{ka}")
        ask = asyncio.ensure_future(broker.permissions.ask(
            ConsentRequest(request_id="pr_x", request=req, deadline=1e12)))
        async with asyncio.timeout(5):
            while not broker.permissions._pending:
                await asyncio.sleep(0.01)
        refused = await rpc("permission.answer", {"request_id": "pr_x", "decision": "allow"}, headers=cred_b)
        assert refused["error"]["data"]["code"] == "NOT_ORIGINATOR"
        assert (await rpc("permission.pending", {}, headers=cred_b))["result"]["requests"] == []

        # events: B's replay from 0 has no trace of A's request; A's has it
        client = AsyncHTTPClient()

        async def replay(headers):
            chunks = []
            url = f"http://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}relay/events?since=0"
            fut = client.fetch(url, headers=headers, streaming_callback=chunks.append, request_timeout=1.5)
            try:
                await fut
            except Exception:
                pass  # the stream does not end by itself; the timeout ends it
            frames, _ = parse_stream(b"".join(chunks).decode())
            return [f["event"] for f in frames]

        assert "permission.request" in await replay(cred_a)
        seen_b = await replay(cred_b)
        assert "permission.request" not in seen_b and "grant.changed" not in seen_b

        answered = await rpc("permission.answer", {"request_id": "pr_x", "decision": "deny"}, headers=cred_a)
        assert answered["result"]["answered_by"] == f"kernel:{ka}"
        assert (await ask).decision.value == "deny"
    finally:
        for kid in (ka, kb):
            await jp_serverapp.kernel_manager.shutdown_kernel(kid, now=True)
    # a shut-down kernel's credential is dead
    with pytest.raises(Exception) as exc:
        await rpc("grants.get", {}, headers=cred_a)
    assert getattr(exc.value, "code", None) == 403


# -- issue 12, "Kernel lifetime": a kernel that restarts, shuts down or dies takes its consent with it -----

CRED = r"""
import os
print(os.environ["RELAY_KERNEL_CREDENTIAL"])
"""


@pytest.fixture
def model_fake():
    with FakeAnthropic(api_key="test-key") as fake:
        yield fake


@pytest.fixture
def jp_server_config(tmp_path, model_fake):
    return {
        "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}},
        "RelayApp": {"data_dir": str(tmp_path / "relaydata"), "heartbeat_interval": 0.2, "consent_timeout": 120.0,
                     "anthropic_base_url": model_fake.base_url, "anthropic_api_key": "test-key",
                     "default_model": "claude-test-1"},
    }


async def _run_waiting_for_consent(jp_serverapp, broker, rpc, model_fake, kernel_id, conversation):
    """A real run, started by the kernel's credential, whose run_code call waits on a card."""
    cred = {"Authorization": "RelayKernel " + (await run_in_kernel(jp_serverapp, kernel_id, CRED)).strip()}
    if (await rpc("grants.get", {}, headers=cred))["result"]["grant"] is None:
        assert "result" in await rpc("grants.create", {"tools": ["run_code"], "models": ["claude-test-1"]}, headers=cred)
    model_fake.enqueue(Reply(tool_use("run_code", {"code": "open('pwned', 'w').write('x')"})))
    started = await rpc("run.start", {"conversation": conversation, "prompt": "go"}, headers=cred)
    run_id = started["result"]["run_id"]
    async with asyncio.timeout(30):
        while not [p for p in broker.permissions._pending.values() if p.request.request.run_id == run_id]:
            assert not [e for e in _events(broker, run_id) if e.type in ("run.error", "run.done")], \
                [(e.type, e.data) for e in _events(broker, run_id)]
            await asyncio.sleep(0.02)
    request_id = next(p.request_id for p in broker.permissions._pending.values()
                      if p.request.request.run_id == run_id)
    return cred, run_id, request_id


def _events(broker, run_id):
    return [e for e in broker.store.events_since(0) if e.run_id == run_id]


async def _ended_and_unanswerable(broker, rpc, run_id, request_id, cred):
    async with asyncio.timeout(30):  # the run is cancelled at once; its task unwinds in a few ticks
        await broker.runs.wait(run_id)
    events = _events(broker, run_id)
    terminal = [e.type for e in events if e.type in TERMINAL_EVENTS]
    assert terminal == ["run.cancelled"]
    resolved = [e.data for e in events if e.type == "permission.resolved"]
    assert [(r["request_id"], r["decision"]) for r in resolved] == [(request_id, "withdrawn")]
    # the side panel's Approve (a browser caller: Jupyter's own token) and the kernel's own answer both fail
    panel = await rpc("permission.answer", {"request_id": request_id, "decision": "allow", "scope": "once"})
    assert panel["error"]["data"]["code"] in ("CONFLICT", "NOT_FOUND")
    if cred is not None:
        kernel = await rpc("permission.answer", {"request_id": request_id, "decision": "allow"}, headers=cred)
        assert kernel["error"]["data"]["code"] in ("CONFLICT", "NOT_FOUND")
    assert not [e for e in _events(broker, run_id) if e.type == "kernel.tool_request"]
    assert [e.data["decision"] for e in _events(broker, run_id) if e.type == "permission.resolved"] == ["withdrawn"]


async def test_restart_and_shutdown_withdraw_pending_consent(jp_fetch, jp_serverapp, rpc, broker, model_fake):
    ka = await start_session(jp_fetch, "life.ipynb")
    try:
        cred, run_id, request_id = await _run_waiting_for_consent(jp_serverapp, broker, rpc, model_fake, ka, "cell-1")
        await jp_fetch("api", "kernels", ka, "restart", method="POST", body="{}")
        await _ended_and_unanswerable(broker, rpc, run_id, request_id, cred)
        assert not os.path.exists(os.path.join(jp_serverapp.root_dir, "pwned"))
        # the notebook's next %%agent in the same cell is not refused with CONFLICT
        model_fake.enqueue(Reply("fresh"))
        again = await rpc("run.start", {"conversation": "cell-1", "prompt": "again"}, headers=cred)
        assert "result" in again, again
        await broker.runs.wait(again["result"]["run_id"])

        # shut down (DELETE, what closing the notebook does): the same, and the credential dies with it
        cred, run_id, request_id = await _run_waiting_for_consent(jp_serverapp, broker, rpc, model_fake, ka, "cell-2")
        await jp_fetch("api", "kernels", ka, method="DELETE")
        ka = None
        await _ended_and_unanswerable(broker, rpc, run_id, request_id, None)
        assert broker.permissions._pending == {}
    finally:
        if ka is not None:
            await jp_serverapp.kernel_manager.shutdown_kernel(ka, now=True)


async def test_a_kernel_that_dies_withdraws_its_pending_consent(jp_fetch, jp_serverapp, rpc, broker, model_fake):
    ka = await start_session(jp_fetch, "dies.ipynb")
    try:
        cred, run_id, request_id = await _run_waiting_for_consent(jp_serverapp, broker, rpc, model_fake, ka, "c")
        km = jp_serverapp.kernel_manager.get_kernel(ka)
        os.kill(km.provisioner.process.pid, signal.SIGKILL)  # the restarter notices and auto-restarts it
        await _ended_and_unanswerable(broker, rpc, run_id, request_id, cred)
    finally:
        if ka in jp_serverapp.kernel_manager:
            km = jp_serverapp.kernel_manager.get_kernel(ka)
            async with asyncio.timeout(60):  # shutting down a kernel mid-restart fails in jupyter_client
                while not km.ready.done():
                    await asyncio.sleep(0.05)
            await jp_serverapp.kernel_manager.shutdown_kernel(ka, now=True)
