"""Lineage keyed by cell id in the broker (issue 13 Deliver 4): ``run.start {cell_id}`` stores the cell with its
turn, and a run of a cell that already took a turn forks there — on a broker on disk closed and opened again
("another day"), with nothing remembered by any kernel. Through the broker's method table, the real runtime and
FakeAnthropic (the kernel-level and browser tests: tests/kernel/test_lineage.py, tests/kernel/test_browser.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.conversation_keys import conversation_key
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.runtime_setup import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import InvalidParams
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import FakeAnthropic, Reply

from .rig import KEY, make_backend

A = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb", client_id="kernel:a")
B = Caller(kind=CallerKind.KERNEL, origin="notebook:b.ipynb", client_id="kernel:b")

pytestmark = pytest.mark.asyncio


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


def open_broker(fake: FakeAnthropic, data_dir: Path) -> Broker:
    broker = Broker.open(BrokerConfig(data_dir=data_dir, default_model="claude-test-1"))
    for caller in (A, B):
        broker.grants.issue(Grant(origin=caller.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                                  consent_id="c"))
    install_runtime(broker, {"anthropic": make_backend("anthropic", fake)})
    return broker


async def run(broker: Broker, caller: Caller, prompt: str, cell_id: str | None) -> dict[str, Any]:
    params = {"conversation": "default", "prompt": prompt, **({"cell_id": cell_id} if cell_id else {})}
    run_id = (await call_method(broker, caller, "run.start", params))["run_id"]
    await broker.runs.wait(run_id)
    (turn,) = [e.data for e in broker.store.events_since(0) if e.run_id == run_id and e.type == EventType.TURN]
    return turn


def sent(fake: FakeAnthropic) -> list[str]:
    return [m["role"] for m in fake.requests[-1].body["messages"]]


async def test_a_rerun_on_another_day_forks_at_the_cell(fake: FakeAnthropic, tmp_path: Path) -> None:
    broker = open_broker(fake, tmp_path)
    try:
        fake.enqueue(Reply("one"), Reply("two"), Reply("three"))
        assert (await run(broker, A, "q1", "c-1"))["parent_cells"] == []
        await run(broker, A, "q2", "c-2")
        turn = await run(broker, A, "q3", "c-3")
        assert turn == {"run_id": turn["run_id"], "turn": 2, "forked_at": None, "parent_cells": ["c-1", "c-2"]}
        assert len(sent(fake)) == 5
    finally:
        broker.close()
    broker = open_broker(fake, tmp_path)  # the next day: a new broker process on the same store
    try:
        fake.enqueue(Reply("two again"), Reply("three again"), Reply("untagged"))
        turn = await run(broker, A, "q2 again", "c-2")
        assert (turn["turn"], turn["forked_at"], turn["parent_cells"]) == (1, 1, ["c-1"])
        assert sent(fake) == ["user", "assistant", "user"]  # turn 1's history: not the 5 messages before
        turn = await run(broker, A, "q3", "c-3")  # its old turn went with the fork: it appends
        assert (turn["turn"], turn["forked_at"]) == (2, None) and len(sent(fake)) == 5
        await run(broker, A, "no cell id", None)  # a frontend without cell ids appends, as before
        assert len(sent(fake)) == 7
        stored = broker.runs.conversations.load_conversation(conversation_key(A.origin, "default"))["messages"]
        assert [m.get("cell_id") for m in stored if m["role"] == "user" and isinstance(m["content"], list)
                and m["content"][0].get("type") == "text"] == ["c-1", "c-2", "c-3", None]
        assert "cell_id" not in str(fake.requests[-1].body)  # stored with the turn, never sent to the model
    finally:
        broker.close()


async def test_a_cell_id_forks_only_its_own_notebooks_conversation(fake: FakeAnthropic, tmp_path: Path) -> None:
    broker = open_broker(fake, tmp_path)
    try:
        fake.enqueue(Reply("a1"), Reply("a2"), Reply("b1"))
        await run(broker, A, "a q1", "same")
        await run(broker, A, "a q2", "other")
        # B's notebook has a cell with the same id (a copied notebook keeps its cell ids) and the same chat name
        turn = await run(broker, B, "b q1", "same")
        assert (turn["turn"], turn["forked_at"]) == (0, None) and sent(fake) == ["user"]
        key = conversation_key(A.origin, "default")
        assert len(broker.runs.conversations.load_conversation(key)["messages"]) == 4  # A's untouched
        for bad in ("", "a b", "x" * 65, "../etc", "vscode-notebook-cell:/x#W0", "c\u202e1", 7):
            with pytest.raises(InvalidParams):
                await call_method(broker, A, "run.start", {"conversation": "default", "prompt": "x", "cell_id": bad})
    finally:
        broker.close()
