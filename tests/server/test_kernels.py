"""Real kernels started through the server: own credential, no secrets, and two notebooks kept apart."""

from __future__ import annotations

import asyncio
import json

import pytest
from tornado.httpclient import AsyncHTTPClient

from relay_jupyter.protocol.sse import parse_stream

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
