"""Two notebooks that both call their chat ``default`` get two conversations and two workspaces."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Refusal
from relay_jupyter.core.types import Grant
from relay_jupyter.testing import FakeAnthropic, Reply

KEY = "sk-ant-test-conversations-0123456789"
A = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb", client_id="kernel:a")
B = Caller(kind=CallerKind.KERNEL, origin="notebook:b.ipynb", client_id="kernel:b")
BROWSER = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:me:default", user="me")


@pytest.mark.asyncio
async def test_same_chat_name_in_two_notebooks_is_two_conversations(tmp_path: Path):
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", default_model="claude-test-1"))
    for caller in (A, B):
        broker.grants.issue(Grant(origin=caller.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                  consent_id=f"click-{caller.client_id}"))
    with FakeAnthropic(api_key=KEY) as fake:
        backend = AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",), timeout=10)
        install_components(broker, jupyter_root=tmp_path, backends={"anthropic": backend})
        try:
            fake.enqueue(Reply("answer for a"), Reply("answer for b"))
            for caller in (A, B):
                run = await call_method(broker, caller, "run.start", {"conversation": "default", "prompt": "hi"})
                await asyncio.wait_for(broker.runs.wait(run["run_id"]), 30)
            # each notebook lists its own "default", under the name it used
            for caller in (A, B):
                listed = (await call_method(broker, caller, "conversations.list", {}))["conversations"]
                assert [(c["conv_id"], c["origin"]) for c in listed] == [("default", caller.origin)]
            # B's history does not contain A's turn
            assert "answer for a" not in str(fake.requests[-1].json["messages"])

            # scratch workspaces are apart: A writes, B cannot read it under the same name
            await call_method(broker, A, "tools.call", {"conversation": "default", "tool": "scratch_write",
                                                        "arguments": {"path": "x.txt", "content": "secret of a"}})
            read_a = await call_method(broker, A, "tools.call", {"conversation": "default", "tool": "scratch_read",
                                                                 "arguments": {"path": "x.txt"}})
            assert "secret of a" in read_a["content"]
            with pytest.raises(Refusal) as info:
                await call_method(broker, B, "tools.call", {"conversation": "default", "tool": "scratch_read",
                                                            "arguments": {"path": "x.txt"}})
            assert info.value.code.value == "NOT_FOUND"

            # fork/delete act on the caller's own conversation; the browser names the origin
            forked = await call_method(broker, BROWSER, "conversations.fork",
                                       {"conversation": "default", "at_turn": 0, "origin": A.origin})
            assert forked["removed_messages"] == 2
            deleted = await call_method(broker, B, "conversations.delete", {"conversation": "default"})
            assert deleted["deleted"]
            still = await call_method(broker, A, "tools.call", {"conversation": "default", "tool": "scratch_read",
                                                                "arguments": {"path": "x.txt"}})
            assert "secret of a" in still["content"]  # B deleting its "default" left A's workspace alone
            assert (await call_method(broker, A, "conversations.list", {}))["conversations"][0]["conv_id"] == "default"
        finally:
            broker.close()
