"""History across cells (issue 17): a second ``%%agent --engine claude-code`` cell of a conversation continues
the first one's Claude Code session (``resume=``, the session id kept by the broker per conversation, also
across a broker restart); a conversation forked by a re-run earlier cell starts a fresh session that gets
the remaining turns as text, never the dropped ones. Reads outside the workspace follow the read scope of
``scratch_pull`` with the real CLI (issue 17 item 3).

The REAL bundled ``claude`` CLI against ``FakeAnthropic``; ``peer``, only inside ``unshare -n``.
"""

from __future__ import annotations

import json

import pytest

from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import Reply, tool_use

from .claude_code_rig import (KEY, MODEL, NB, ONLY_ISOLATED, answer, close, events, fake, result_text,
                              terminal, tool_results)

pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.asyncio, ONLY_ISOLATED]


def _broker(tmp_path, fake, *origins: str) -> Broker:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=30, anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL,
                                      default_engine="claude-code"))
    for origin in origins or (NB.origin,):
        broker.grants.issue(Grant(origin=origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="t"))
    install_components(broker, jupyter_root=root)
    return broker


async def _cell(broker: Broker, conversation: str, prompt: str, caller: Caller = NB) -> str:
    run_id = (await call_method(broker, caller, "run.start", {"conversation": conversation, "prompt": prompt}))[
        "run_id"]
    assert await terminal(broker, run_id) == EventType.DONE
    return run_id


def _said(messages: list[dict], role: str) -> list[str]:
    return [json.dumps(m.get("content")) for m in messages if m.get("role") == role]


async def test_the_next_cell_resumes_the_session_and_a_fork_starts_a_fresh_one(tmp_path, fake):
    broker = _broker(tmp_path, fake)
    try:
        fake.enqueue(Reply("Noted: the code word is PLUM."))
        await _cell(broker, "h1", "remember the code word PLUM")
        fake.enqueue(Reply("The code word was PLUM."))
        await _cell(broker, "h1", "what was the code word?")
        sent = fake.requests[-1].body["messages"]
        # resumed: the CLI sent the first turn as its own messages (not relay's text of it), then the new prompt
        users, assistants = _said(sent, "user"), _said(sent, "assistant")
        assert any("remember the code word PLUM" in u for u in users[:-1])
        assert any("Noted: the code word is PLUM." in a for a in assistants)
        assert "what was the code word?" in users[-1] and "remember" not in users[-1]
        assert "earlier-conversation" not in json.dumps(sent)
    finally:
        await close(broker)
        broker.close()

    # the broker keeps the session id on disk: after a restart the third cell still resumes it
    broker = _broker(tmp_path, fake)
    try:
        fake.enqueue(Reply("Third answer."))
        await _cell(broker, "h1", "and a third question")
        sent = fake.requests[-1].body["messages"]
        joined = json.dumps(sent)
        assert "remember the code word PLUM" in joined and "The code word was PLUM." in joined
        assert "earlier-conversation" not in joined and "and a third question" in _said(sent, "user")[-1]

        # re-running the second cell forks the conversation at its turn: turns 1 and 2 are dropped
        await call_method(broker, NB, "conversations.fork", {"conversation": "h1", "at_turn": 1})
        fake.enqueue(Reply("Forked answer."))
        await _cell(broker, "h1", "what was the code word, again?")
        sent = fake.requests[-1].body["messages"]
        joined = json.dumps(sent)
        assert len(_said(sent, "user")) == 1  # a fresh session: one prompt, with the kept turn as text
        assert "earlier-conversation" in joined and "remember the code word PLUM" in joined
        assert "Noted: the code word is PLUM." in joined
        assert "The code word was PLUM." not in joined and "and a third question" not in joined  # dropped

        # another conversation of the same notebook shares nothing with this one
        fake.enqueue(Reply("Fresh."))
        await _cell(broker, "h2", "hello")
        assert "PLUM" not in json.dumps(fake.requests[-1].body["messages"])
    finally:
        await close(broker)
        broker.close()


async def test_reads_outside_the_workspace_follow_the_read_scope(tmp_path, fake):
    """A notebook in ``sub/`` reads its own directory without a card; elsewhere in the Jupyter root a card
    names the file (Approve: its bytes reach the model); its user's ``~/.ssh/id_rsa`` outside the root, and
    ``~`` paths, are refused and their bytes never reach the model."""
    nb = Caller(kind=CallerKind.KERNEL, origin="notebook:sub/analysis.ipynb", client_id="kernel:scope")
    broker = _broker(tmp_path, fake, nb.origin)
    root = tmp_path / "root"
    (root / "sub").mkdir()
    (root / "sub" / "mine.csv").write_text("MINE-CONTENT\n")
    (root / "data").mkdir()
    (root / "data" / "table.csv").write_text("TABLE-CONTENT\n")
    home = tmp_path / "home"  # the user's own home, outside the Jupyter root
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY MATERIAL\n")
    try:
        fake.enqueue(Reply(tool_use("Read", {"file_path": str(root / "sub" / "mine.csv")}, id="toolu_mine"),
                           tool_use("Read", {"file_path": str(home / ".ssh" / "id_rsa")}, id="toolu_key"),
                           tool_use("Read", {"file_path": "~/.ssh/id_rsa"}, id="toolu_tilde"),
                           tool_use("Read", {"file_path": str(root / "data" / "table.csv")}, id="toolu_table")),
                     Reply("Read what I could."))
        run_id = (await call_method(broker, nb, "run.start", {"conversation": "s", "prompt": "read them"}))["run_id"]
        card = await answer(broker, "allow", nb)
        assert card["tool"] == "Read" and str(root / "data" / "table.csv") in json.dumps(card)
        assert await terminal(broker, run_id) == EventType.DONE
        assert len(events(broker, run_id, EventType.PERMISSION_REQUEST)) == 1  # only the read outside sub/
        results = {b["tool_use_id"]: b for b in tool_results(fake)}
        assert "MINE-CONTENT" in result_text(results["toolu_mine"]) and not results["toolu_mine"].get("is_error")
        assert "TABLE-CONTENT" in result_text(results["toolu_table"])
        for refused in ("toolu_key", "toolu_tilde"):
            assert results[refused].get("is_error") and "relay refused" in result_text(results[refused])
        assert "credential" in result_text(results["toolu_key"])
        assert "PRIVATE KEY MATERIAL" not in json.dumps([r.body for r in fake.requests])
    finally:
        await close(broker)
