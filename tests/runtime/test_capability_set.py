"""docs/security.md: the model is handed a hard capability set for each run — only the tools the
notebook's grant allows (and the run's ``tools`` restriction) are offered; the gate still refuses
anything else with SCOPE_EXCEEDED."""

from __future__ import annotations

from typing import Any

import pytest

from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import Reply, tool_use

from .rig import ORIGIN, make_rig, tool_results


def offered(body: dict[str, Any]) -> list[str]:
    """Tool names of a recorded request, either API."""
    return sorted(t["function"]["name"] if "function" in t else t["name"] for t in body.get("tools") or [])


@pytest.mark.asyncio
async def test_only_granted_tools_are_offered(fake, backend_name):
    rig = make_rig(backend_name, fake)
    rig.book.narrow(ORIGIN, tools=["read_note"])
    fake.enqueue(Reply("ok"))
    _, terminal = await rig.run()
    assert terminal == EventType.DONE
    assert offered(fake.requests[0].body) == ["read_note"]


@pytest.mark.asyncio
async def test_grant_and_run_restriction_intersect(fake, backend_name):
    rig = make_rig(backend_name, fake)
    rig.book.narrow(ORIGIN, tools=["read_note", "write_file"])
    fake.enqueue(Reply("ok"))
    _, terminal = await rig.run(tools=["write_file", "slow_write"])
    assert terminal == EventType.DONE
    assert offered(fake.requests[0].body) == ["write_file"]


@pytest.mark.asyncio
async def test_a_tool_outside_the_grant_is_still_refused_by_the_gate(fake, backend_name):
    rig = make_rig(backend_name, fake)
    rig.book.narrow(ORIGIN, tools=["read_note"])
    fake.enqueue(Reply(tool_use("write_file", {"path": "x", "content": "y"}, id="call_w")), Reply("sorry"))
    _, terminal = await rig.run()
    assert terminal == EventType.DONE
    assert rig.tools.written == []
    (_, content, _), = tool_results(fake.requests[1].body)
    assert "SCOPE_EXCEEDED" in content
    denials = [r for r in rig.audit.records if r.tool == "write_file"]
    assert [(r.decision, r.code) for r in denials] == [("deny", "SCOPE_EXCEEDED")]


@pytest.mark.asyncio
async def test_narrowing_mid_run_shrinks_the_offer_at_the_next_step(fake, backend_name):
    rig = make_rig(backend_name, fake)
    rig.tools.notes = "narrowing now"
    orig_read = rig.tools._read

    def read_and_narrow(args):
        rig.book.narrow(ORIGIN, tools=["read_note"])
        return orig_read(args)

    rig.tools._read = read_and_narrow  # type: ignore[method-assign]
    rig.manager.providers = [rig.tools.provider()]
    fake.enqueue(Reply(tool_use("read_note", {}, id="call_r")), Reply("done"))
    _, terminal = await rig.run()
    assert terminal == EventType.DONE
    assert offered(fake.requests[0].body) == ["read_note", "slow_write", "write_file"]
    assert offered(fake.requests[1].body) == ["read_note"]
