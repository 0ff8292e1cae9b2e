"""Attack: approve a permission request without the user's click.

A real Jupyter server (pytest-jupyter) with real kernels of two notebooks, and the fake Anthropic server as the
model. Notebook A's run proposes ``run_code`` that would write ``pwned``; the request waits for a card. Then the
attacker tries every other way to get an Approve in, through the public RPC only:

- notebook B's kernel, holding A's request id (as if it leaked), answers it, lists it, cancels A's run,
  and calls the tool for A's origin;
- a forged request id, and A's own kernel widening the answer (``run``/``notebook`` scope for run_code);
- once A's kernel has denied, a replayed Allow — by the kernel and by the browser session;
- an Allow sent after the run went away (cancelled by its originator).

Held: none of them gets an ``allow`` decision for the call (the audit, read over RPC, has none), and the
answer that resolves a request is the originator's or the browser user's, exactly once. The check can fail:
the browser user's Allow of a fresh request is the one ``allow`` in the audit, answered by that browser session.
(The run's kernel runs no follower here, so even an allowed ``run_code`` would wait for it; the gate's
decision is what is under attack.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyter_kernels import KernelRig

from relay_jupyter.testing import FakeAnthropic, Reply, tool_use

pytestmark = pytest.mark.slow

CODE = "open('pwned', 'w').write('x')"


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


async def test_nothing_but_the_originator_or_the_user_approves(jp_fetch, jp_serverapp, model_fake) -> None:
    rig = KernelRig(jp_fetch, jp_serverapp)
    rpc, session, credential = rig.rpc, rig.session, rig.credential

    def code(answer: dict[str, Any]) -> str:
        assert "error" in answer, answer
        return answer["error"]["data"]["code"]

    async def waiting(cred: dict[str, str], conversation: str) -> tuple[str, str]:
        model_fake.enqueue(Reply(tool_use("run_code", {"code": CODE})))
        run_id = (await rpc("run.start", {"conversation": conversation, "prompt": "go"}, cred))["result"]["run_id"]
        async with asyncio.timeout(30):
            while True:
                pending = (await rpc("permission.pending", {}, cred))["result"]["requests"]
                mine = [p for p in pending if p["run_id"] == run_id]
                if mine:
                    return run_id, mine[0]["request_id"]
                await asyncio.sleep(0.05)

    async def ended(cred: dict[str, str], run_id: str) -> dict[str, Any]:
        async with asyncio.timeout(30):
            while True:
                run = (await rpc("runs.get", {"run_id": run_id}, cred))["result"]["run"]
                if run["state"] not in ("running", "pending", "waiting"):
                    return run
                await asyncio.sleep(0.05)

    async def allows(cred: dict[str, str]) -> list[dict[str, Any]]:
        records = (await rpc("audit.tail", {"n": 1000}, cred))["result"]["records"]
        return [r for r in records if r["tool"] == "run_code" and r["decision"] == "allow"]

    ka = await session("a.ipynb")
    kb = await session("b.ipynb")
    try:
        cred_a, cred_b = await credential(ka), await credential(kb)
        assert "result" in await rpc("grants.create", {"tools": ["run_code"], "models": ["claude-test-1"]}, cred_a)
        assert "result" in await rpc("grants.create", {"tools": ["run_code"], "models": ["claude-test-1"]}, cred_b)
        run_id, request_id = await waiting(cred_a, "c1")

        # notebook B holds A's ids: it sees nothing, answers nothing, cancels nothing
        assert (await rpc("permission.pending", {}, cred_b))["result"]["requests"] == []
        for decision in ("allow", "deny"):
            assert code(await rpc("permission.answer", {"request_id": request_id, "decision": decision}, cred_b)) \
                in ("NOT_ORIGINATOR", "NOT_FOUND")
        assert code(await rpc("run.cancel", {"run_id": run_id}, cred_b)) == "NOT_FOUND"
        assert code(await rpc("runs.get", {"run_id": run_id}, cred_b)) == "NOT_FOUND"
        assert code(await rpc("tools.call", {"conversation": "c1", "tool": "run_code", "arguments": {"code": CODE},
                                             "origin": "notebook:a.ipynb"}, cred_b)) == "UNAUTHORIZED"
        # a forged id; A itself widening run_code's answer: refused, still pending
        assert code(await rpc("permission.answer", {"request_id": "perm_" + "0" * 24, "decision": "allow"},
                              cred_a)) in ("NOT_FOUND", "INVALID_PARAMS")
        for scope in ("run", "notebook"):
            assert code(await rpc("permission.answer", {"request_id": request_id, "decision": "allow",
                                                        "scope": scope}, cred_a)) == "WIDENING_REFUSED"
        assert [p["request_id"] for p in (await rpc("permission.pending", {}, cred_a))["result"]["requests"]] \
            == [request_id]

        # the originator denies; every replayed Allow after that is CONFLICT and runs nothing
        assert (await rpc("permission.answer", {"request_id": request_id, "decision": "deny"}, cred_a))["result"]
        for cred in (cred_a, None, cred_b):
            assert code(await rpc("permission.answer", {"request_id": request_id, "decision": "allow"}, cred)) \
                in ("CONFLICT", "NOT_FOUND", "NOT_ORIGINATOR")
        assert (await ended(cred_a, run_id))["state"] == "done"
        assert await allows(cred_a) == []

        # an Allow after the run went away (cancelled by its originator) runs nothing either
        run_id, request_id = await waiting(cred_a, "c2")
        assert (await rpc("run.cancel", {"run_id": run_id}, cred_a))["result"]["cancelled"] is True
        await ended(cred_a, run_id)
        for cred in (cred_a, None):
            assert code(await rpc("permission.answer", {"request_id": request_id, "decision": "allow"}, cred)) \
                in ("CONFLICT", "NOT_FOUND")
        assert await allows(cred_a) == []

        # the check can fail: the user's own Allow (the browser session, Jupyter's token) does run the code
        run_id, request_id = await waiting(cred_a, "c3")
        answered = (await rpc("permission.answer", {"request_id": request_id, "decision": "allow"}))["result"]
        assert answered["answered_by"].startswith("browser:")
        async with asyncio.timeout(30):
            while not await allows(cred_a):
                await asyncio.sleep(0.05)
        allowed = await allows(cred_a)
        assert [(r["run_id"], r["answered_by"]) for r in allowed] == [(run_id, answered["answered_by"])], allowed
        await rpc("run.cancel", {"run_id": run_id}, cred_a)  # it would wait for a kernel follower
        await ended(cred_a, run_id)
    finally:
        for kernel_id in (ka, kb):
            await jp_serverapp.kernel_manager.shutdown_kernel(kernel_id, now=True)
