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


# -- issue 11 item 8: structured keys ---------------------------------------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from relay_jupyter.core.errors import InvalidParams  # noqa: E402
from relay_jupyter.broker.conversation_keys import (  # noqa: E402
    conversation_key,
    conversation_name,
    legacy_key,
    migrate_legacy_keys,
    split_conversation_key,
)


@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40), st.text(max_size=40))
def test_keys_of_different_pairs_differ_and_split_back(o1, n1, o2, n2) -> None:
    k1, k2 = conversation_key(o1, n1), conversation_key(o2, n2)
    assert (k1 == k2) == ((o1, n1) == (o2, n2))
    assert split_conversation_key(k1) == (o1, n1)


def test_keys_are_ascii_even_for_undecodable_notebook_paths(tmp_path: Path) -> None:
    origin = "notebook:caf\u00e9/\udcff.ipynb"  # a lone surrogate: a file name that was not UTF-8
    key = conversation_key(origin, "default")
    assert key.isascii() and split_conversation_key(key) == (origin, "default")
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay"))
    try:
        broker.store.save_conversation(key, "notebook:x", "n", [], {})
        assert broker.store.load_conversation(key)["conv_id"] == key
    finally:
        broker.close()


def test_the_joined_string_collision_is_gone() -> None:
    assert legacy_key("notebook:a|b", "c") == legacy_key("notebook:a", "b|c")  # the old bug
    assert conversation_key("notebook:a|b", "c") != conversation_key("notebook:a", "b|c")
    assert split_conversation_key("notebook:a|default") is None
    assert split_conversation_key('["a","b","c"]') is None and split_conversation_key('["a", "b"]') is None


@pytest.mark.asyncio
@pytest.mark.parametrize("method,params", [
    ("workspace.diff", {"conversation": "x|default", "path": "f.txt"}),
    ("tools.call", {"conversation": "x|default", "tool": "scratch_read", "arguments": {"path": "f.txt"}}),
    ("tools.list", {"conversation": "a b"}),
    ("run.start", {"conversation": 'a"b', "prompt": "hi"}),
    ("conversations.delete", {"conversation": "a|b"}),
    ("conversations.fork", {"conversation": "", "at_turn": 0}),
])
async def test_every_params_model_applies_the_one_name_pattern(tmp_path: Path, method: str, params: dict):
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay"))
    install_components(broker, jupyter_root=tmp_path)
    try:
        with pytest.raises(InvalidParams):
            await call_method(broker, A, method, params)
    finally:
        broker.close()


@pytest.mark.asyncio
async def test_a_pipe_in_a_name_cannot_reach_another_notebooks_workspace(tmp_path: Path):
    """The issue's attack: origin ``notebook:x`` naming ``y|default`` would have reached the workspace
    of origin ``notebook:x|y``'s ``default`` (their joined strings were equal)."""
    victim = Caller(kind=CallerKind.KERNEL, origin="notebook:x|y", client_id="kernel:v")
    attacker = Caller(kind=CallerKind.KERNEL, origin="notebook:x", client_id="kernel:a")
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay"))
    for caller in (victim, attacker):
        broker.grants.issue(Grant(origin=caller.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                  consent_id=f"click-{caller.client_id}"))
    install_components(broker, jupyter_root=tmp_path / "root")
    try:
        broker.workspace_tools.manager.for_conversation(conversation_key(victim.origin, "default")).write(
            "f.txt", b"victim's draft\n")
        with pytest.raises(InvalidParams):
            await call_method(broker, attacker, "workspace.diff", {"conversation": "y|default", "path": "f.txt"})
        # the raw key layer: the attacker's pair is a different key, so a different (empty) workspace
        assert broker.workspace_tools.manager.root_for(conversation_key(attacker.origin, "y|default")) != \
            broker.workspace_tools.manager.root_for(conversation_key(victim.origin, "default"))
    finally:
        broker.close()


def test_legacy_rows_and_workspaces_migrate_once(tmp_path: Path):
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay"))
    store = broker.store
    store.save_conversation(legacy_key("notebook:a|b.ipynb", "default"), "notebook:a|b.ipynb", "first prompt",
                            [{"role": "user", "content": "hi"}], {})
    from relay_jupyter.workspace.scratch import WorkspaceManager

    manager = WorkspaceManager(tmp_path / "relay" / "workspaces")
    manager.for_conversation(legacy_key("notebook:a|b.ipynb", "default")).write("draft.txt", b"kept\n")
    assert migrate_legacy_keys(store, tmp_path / "relay" / "workspaces") == 1
    new = conversation_key("notebook:a|b.ipynb", "default")
    row = store.load_conversation(new)
    assert row["messages"] == [{"role": "user", "content": "hi"}] and row["name"] == "first prompt"
    assert store.load_conversation(legacy_key("notebook:a|b.ipynb", "default")) is None
    assert WorkspaceManager(tmp_path / "relay" / "workspaces").for_conversation(new).read("draft.txt") == b"kept\n"
    assert migrate_legacy_keys(store, tmp_path / "relay" / "workspaces") == 0  # idempotent
    assert conversation_name(new) == "default"
    assert conversation_name(legacy_key("notebook:a", "n"), "notebook:a") == "n"
    broker.close()
