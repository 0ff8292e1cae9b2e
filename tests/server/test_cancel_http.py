"""The cancel rule over HTTP in a real Jupyter server with real kernels (docs/runtime.md): for ``run.cancel``
and ``runs.cancel`` alike, a kernel of another notebook gets ``NOT_FOUND`` (the answer for a run that does not
exist), the kernel that started the run cancels it, and so does the browser user (Jupyter's own token).
A second kernel of the same notebook (``NOT_ORIGINATOR``) cannot be started through the sessions API, which
reuses a notebook's kernel: ``tests/broker/test_cancel_rule.py`` covers it on the broker."""

from __future__ import annotations

import asyncio

import pytest
from test_kernels import CRED, jp_server_config, model_fake, run_in_kernel, start_session  # noqa: F401 (fixtures)

from relay_jupyter.protocol.names import TERMINAL_EVENTS
from relay_jupyter.testing import Reply

pytestmark = pytest.mark.slow


async def _credential(jp_serverapp, kernel_id):
    return {"Authorization": "RelayKernel " + (await run_in_kernel(jp_serverapp, kernel_id, CRED)).strip()}


async def _long_run(rpc, model_fake, cred, conversation):
    model_fake.enqueue(Reply("word " * 50_000, tokens_per_second=50, chunk_tokens=1))
    started = await rpc("run.start", {"conversation": conversation, "prompt": "go"}, headers=cred)
    return started["result"]["run_id"]


async def _ended(broker, run_id):
    async with asyncio.timeout(60):
        await broker.runs.wait(run_id)
    return [e.type for e in broker.store.events_since(0) if e.run_id == run_id and e.type in TERMINAL_EVENTS]


async def test_cancel_rule_over_http_for_both_methods(jp_fetch, jp_serverapp, rpc, broker, model_fake):
    ka = await start_session(jp_fetch, "a.ipynb")
    kb = await start_session(jp_fetch, "b.ipynb")
    try:
        a, b = await _credential(jp_serverapp, ka), await _credential(jp_serverapp, kb)
        assert "result" in await rpc("grants.create", {"tools": [], "models": ["claude-test-1"]}, headers=a)
        for method in ("run.cancel", "runs.cancel"):
            mine = await _long_run(rpc, model_fake, a, f"{method}-1")
            missing = await rpc(method, {"run_id": "run_does_not_exist"}, headers=b)
            other = await rpc(method, {"run_id": mine}, headers=b)
            assert other["error"]["data"]["code"] == missing["error"]["data"]["code"] == "NOT_FOUND"
            assert broker.runs.get(mine) is not None, "another notebook's refused cancel stopped the run"
            assert (await rpc(method, {"run_id": mine}, headers=a))["result"] == {"cancelled": True}
            assert await _ended(broker, mine) == ["run.cancelled"]
            assert (await rpc(method, {"run_id": mine}, headers=a))["result"] == {"cancelled": False}
            assert (await rpc(method, {"run_id": mine}, headers=b))["error"]["data"]["code"] == "NOT_FOUND"

            panel = await _long_run(rpc, model_fake, a, f"{method}-2")
            assert (await rpc(method, {"run_id": panel}))["result"] == {"cancelled": True}  # the browser user
            assert await _ended(broker, panel) == ["run.cancelled"]
    finally:
        for kernel_id in (ka, kb):
            await jp_serverapp.kernel_manager.shutdown_kernel(kernel_id, now=True)
