"""Kernel tools to Claude Code (issue 17; issue 20 Deliver 6): a claude-code run a kernel started is offered that
kernel's tools (``list_variables``, ``describe_dataframe``, ``propose_cell``, ``run_code``) through relay's gated
MCP gateway, gated exactly as in the relay engine — a read runs in the run's kernel without a card, ``run_code``
shows its exact code on a card offering only "once" (Approve: the kernel is asked to run it; Deny: it is not, and
the model reads the refusal). Each call is journalled and audited under the model's own ``tool_use`` id (the
engine's PreToolUse hook announces it to the gateway), so crash repair and the audit name the call the model
proposed.

The REAL bundled ``claude`` CLI against ``FakeAnthropic``; ``peer``, only inside ``unshare -n``. The test plays
the run's kernel (it answers ``kernel.tool_request`` as the kernel client would).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import Reply, tool_use

from .claude_code_rig import (KEY, MODEL, NB, ONLY_ISOLATED, close, events, fake, open_request,  # noqa: F401
                              result_text, terminal, tool_results)

pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.asyncio, ONLY_ISOLATED]


def _kernel_requests(broker: Broker, run_id: str) -> list[dict[str, Any]]:
    return [dict(e.data) for e in events(broker, run_id, EventType.KERNEL_TOOL_REQUEST)]


async def _play_kernel(broker: Broker, run_id: str, answers: dict[str, str], stop: asyncio.Event) -> None:
    """Answer each kernel.tool_request of the run as its kernel (NB's client) would."""
    done: set[str] = set()
    while not stop.is_set():
        for request in _kernel_requests(broker, run_id):
            if request["request_id"] not in done:
                done.add(request["request_id"])
                assert request["client_id"] == NB.client_id  # asked of the run's own kernel, no other
                broker.kernel_bridge.deliver(NB, request["request_id"], answers[request["tool"]], False)
        await asyncio.sleep(0.05)


async def test_a_kernel_started_run_gets_its_kernels_tools_gated_as_in_the_relay_engine(tmp_path, fake):
    root = tmp_path / "root"
    root.mkdir()
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=30, anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL,
                                      default_engine="claude-code"))
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="t"))
    install_components(broker, jupyter_root=root)
    stop = asyncio.Event()
    try:
        fake.enqueue(Reply(tool_use("mcp__relay__list_variables", {}, id="toolu_kt_vars")),
                     Reply(tool_use("mcp__relay__run_code", {"code": "x = 41 + 1; print(x)"}, id="toolu_kt_run")),
                     Reply(tool_use("mcp__relay__run_code", {"code": "import shutil; shutil.rmtree('/')"},
                                    id="toolu_kt_no")),
                     Reply("Done with the kernel."))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "k", "prompt": "look at my data"}))[
            "run_id"]
        kernel = asyncio.ensure_future(_play_kernel(broker, run_id, {"list_variables": "df: DataFrame (3x2)",
                                                                     "run_code": "42"}, stop))
        card = await open_request(broker, run_id)  # the read asked nothing; run_code asks, with its exact code
        assert card["tool"] == "run_code" and card["arguments"] == {"code": "x = 41 + 1; print(x)"}
        assert card["scopes"] == ["once"]  # as in the relay engine: code in the kernel is approved call by call
        assert [r["tool"] for r in _kernel_requests(broker, run_id)] == ["list_variables"]  # not run before Approve
        await call_method(broker, NB, "permission.answer", {"request_id": card["request_id"], "decision": "allow"})
        second = await open_request(broker, run_id)
        assert second["tool"] == "run_code" and "rmtree" in second["arguments"]["code"]
        await call_method(broker, NB, "permission.answer", {"request_id": second["request_id"], "decision": "deny"})
        assert await terminal(broker, run_id) == EventType.DONE

        # the CLI was offered the kernel's tools (relay's gateway listed them) and the kernel ran two of its calls
        offered = {t["name"] for t in (fake.requests[0].body or {}).get("tools") or []}
        assert {"mcp__relay__list_variables", "mcp__relay__run_code", "mcp__relay__describe_dataframe"} <= offered
        ran = _kernel_requests(broker, run_id)
        assert [(r["tool"], r["arguments"]) for r in ran] == [("list_variables", {}),
                                                              ("run_code", {"code": "x = 41 + 1; print(x)"})]
        results = {b["tool_use_id"]: b for b in tool_results(fake)}
        assert "df: DataFrame (3x2)" in result_text(results["toolu_kt_vars"])
        assert "42" in result_text(results["toolu_kt_run"]) and not results["toolu_kt_run"].get("is_error")
        assert results["toolu_kt_no"].get("is_error") and "CONSENT_DENIED" in result_text(results["toolu_kt_no"])

        # journal and audit name the model's own tool_use ids, not gateway-made ones
        run = (await call_method(broker, NB, "runs.get", {"run_id": run_id}))["run"]
        assert [(c["call_id"], c["tool"]) for c in run["calls"]] == [("toolu_kt_vars", "list_variables"),
                                                                     ("toolu_kt_run", "run_code")]
        audit = {(r.call_id, r.tool, r.decision) for r in broker.audit.tail(1000, origin=NB.origin) if r.tool
                 in ("list_variables", "run_code")}
        assert audit == {("toolu_kt_vars", "list_variables", "allow"), ("toolu_kt_run", "run_code", "allow"),
                         ("toolu_kt_no", "run_code", "deny")}
        proposed = [e.data["call_id"] for e in events(broker, run_id, EventType.TOOL_PROPOSED)]
        assert proposed == ["toolu_kt_vars", "toolu_kt_run", "toolu_kt_no"]
        stop.set()
        await kernel  # the played kernel saw only requests for its own client id
    finally:
        stop.set()
        await close(broker)
        broker.close()
