"""Reads are scoped (issue 11 items 2 and 3): a pull under the notebook's own directory needs no card,
any other pull is a write with a card naming the file, and credential stores and protected targets are
refused for pull and push even with an approval. Real files, real WorkspaceTools."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from relay_jupyter.core.errors import WorkspaceRefusal
from relay_jupyter.core.protected import ProtectedPaths, ReadRoots
from relay_jupyter.storage.checkpoints import CheckpointJournal
from relay_jupyter.workspace.scratch import WorkspaceManager
from relay_jupyter.workspace.tools import CALL_CLASS_KEY, WorkspaceTools

from .traversal_corpus import corpus

NB = "notebook:proj/analysis.ipynb"
SECRET = "SECRET-7f3a9c"


@pytest.fixture
def env(tmp_path: Path):
    root = tmp_path / "root"
    (root / "proj" / "data").mkdir(parents=True)
    (root / "proj" / "data" / "x.csv").write_text("a,b\n1,2\n")
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("not secret, but outside the notebook's directory\n")
    creds = {".ssh/id_rsa": SECRET, ".aws/credentials": SECRET, ".env": SECRET, "proj/.env.local": SECRET,
             "proj/server.pem": SECRET, ".git/config": SECRET, "mcp.json": SECRET, ".netrc": SECRET,
             ".docker/config.json": SECRET, "cfg/servers.json": SECRET, "keys.toml": SECRET}
    for rel, text in creds.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(SECRET)
    data = tmp_path / "data"
    journal = CheckpointJournal(data / "relay.db")
    protected = ProtectedPaths.for_jupyter(root, data_dir=data, config_dirs=[tmp_path / "cfgdir"],
                                           runtime_dir=tmp_path / "rt", mcp_config=root / "cfg" / "servers.json",
                                           secrets_file=root / "keys.toml")
    tools = WorkspaceTools(WorkspaceManager(data / "workspaces"), root, journal, protected)
    yield SimpleNamespace(root=root, tools=tools, journal=journal, creds=creds, tmp=tmp_path)
    journal.close()


def pull(tools: WorkspaceTools, source: str, origin: str | None = NB, approve: bool = False):
    reasons, preview = asyncio.run(tools.preflight("c1", "scratch_pull", {"source": source, "path": "p"},
                                                   origin=origin))
    out = None
    if approve or not preview:
        out = asyncio.run(tools.call("c1", "scratch_pull", {"source": source, "path": "p"}, origin=origin,
                                     approved_preview={k: v for k, v in preview.items() if k != CALL_CLASS_KEY}))
    return reasons, preview, out


def test_a_pull_under_the_notebook_dir_needs_no_card(env) -> None:
    reasons, preview, out = pull(env.tools, "proj/data/x.csv")
    assert reasons == [] and preview == {} and not out["is_error"]


def test_a_pull_elsewhere_is_a_write_whose_card_names_the_file_and_the_provider(env) -> None:
    reasons, preview, out = pull(env.tools, "other/notes.txt")
    assert preview[CALL_CLASS_KEY] == "write" and out is None
    assert preview["source"] == "other/notes.txt" and preview["size"] > 0 and len(preview["source_sha256"]) == 64
    text = "\n".join(reasons)
    assert "other/notes.txt" in text and "outside this notebook's read roots (proj/)" in text
    assert "model provider" in text


def test_daemon_origins_have_no_read_root_unless_configured(env) -> None:
    _reasons, preview, _ = pull(env.tools, "proj/data/x.csv", origin="daemon:kernel:nb")
    assert preview[CALL_CLASS_KEY] == "write"
    _reasons, preview, _ = pull(env.tools, "proj/data/x.csv", origin=None)
    assert preview[CALL_CLASS_KEY] == "write"
    env.tools.read_roots = ReadRoots(["proj/data"])
    assert pull(env.tools, "proj/data/x.csv", origin="daemon:kernel:nb")[1] == {}
    # '{notebook_dir}' is not in this list: the notebook's own directory now asks too
    (env.root / "proj" / "a.txt").write_text("x")
    assert pull(env.tools, "proj/a.txt", origin=NB)[1][CALL_CLASS_KEY] == "write"


def test_a_symlink_out_of_the_notebook_dir_is_judged_by_where_it_points(env) -> None:
    os.symlink(env.root / "other" / "notes.txt", env.root / "proj" / "link.txt")
    with pytest.raises(WorkspaceRefusal) as exc:  # card first (resolved outside proj/), then O_NOFOLLOW refuses
        _r, preview, _ = pull(env.tools, "proj/link.txt")
        assert preview[CALL_CLASS_KEY] == "write"
        pull(env.tools, "proj/link.txt", approve=True)
    assert exc.value.code.value == "PATH_REFUSED"


def test_the_approval_is_bound_to_the_file_it_showed(env) -> None:
    _r, preview, _ = pull(env.tools, "other/notes.txt")
    (env.root / "other" / "notes.txt").write_text("changed after the card was shown\n")
    with pytest.raises(WorkspaceRefusal) as exc:
        asyncio.run(env.tools.call("c1", "scratch_pull", {"source": "other/notes.txt", "path": "p"}, origin=NB,
                                   approved_preview=preview))
    assert exc.value.code.value == "DIGEST_MISMATCH"


def test_credentials_and_protected_targets_are_refused_for_pull_even_approved(env) -> None:
    for rel in env.creds:
        with pytest.raises(WorkspaceRefusal) as exc:
            pull(env.tools, rel, approve=True)
        assert exc.value.code.value == "PATH_REFUSED", rel
        # the direct call (an approval forged by a client) refuses as well
        with pytest.raises(WorkspaceRefusal):
            asyncio.run(env.tools.call("c1", "scratch_pull", {"source": rel, "path": "p"}, origin=NB,
                                       approved_preview={"source": rel}))
    assert not env.tools.manager.for_conversation("c1").exists("p")


def test_credentials_and_protected_targets_are_refused_for_push_even_approved(env) -> None:
    t = env.tools
    asyncio.run(t.call("c1", "scratch_write", {"path": "w.txt", "content": "evil\n"}))
    for rel in env.creds:
        before = (env.root / rel).read_bytes()
        with pytest.raises(WorkspaceRefusal):
            asyncio.run(t.preflight("c1", "scratch_push", {"path": "w.txt", "target": rel}))
        forged = {"path": "w.txt", "target": rel, "workspace_sha256": "x", "target_sha256": "y"}
        with pytest.raises(WorkspaceRefusal) as exc:
            asyncio.run(t.call("c1", "scratch_push", {"path": "w.txt", "target": rel}, run_id="r", origin=NB,
                               approved_preview=forged))
        assert exc.value.code.value == "PATH_REFUSED"
        assert (env.root / rel).read_bytes() == before
    assert env.journal.list() == []


def test_the_traversal_corpus_never_reads_a_secret(env) -> None:
    """Every payload, approved: refused, not found, or a harmless file in the root; never a secret."""
    t = env.tools
    ws = t.manager.for_conversation("c1")
    outcomes: dict[str, int] = {}
    payloads = corpus()
    assert len(payloads) > 5000
    for payload in payloads:
        try:
            _r, preview = t._preflight("c1", "scratch_pull", {"source": payload, "path": "p"}, NB)
            out = t._call("c1", "scratch_pull", {"source": payload, "path": "p"}, None, NB,
                          {k: v for k, v in preview.items() if k != CALL_CLASS_KEY})
        except WorkspaceRefusal as exc:
            outcomes[exc.code.value] = outcomes.get(exc.code.value, 0) + 1
            continue
        assert SECRET not in ws.read("p").decode("utf-8", "replace"), payload
        assert not out["is_error"]
        outcomes["read"] = outcomes.get("read", 0) + 1
    assert outcomes.get("PATH_REFUSED", 0) > len(payloads) // 2, outcomes
    print("traversal corpus outcomes:", outcomes)


def test_workspace_diff_refuses_credentials(env) -> None:
    from relay_jupyter.broker.methods import workspace as wm
    from relay_jupyter.broker.conversation_keys import conversation_key
    from relay_jupyter.core.caller import Caller, CallerKind

    caller = Caller(kind=CallerKind.KERNEL, origin=NB, client_id="kernel:k")
    env.tools.manager.for_conversation(conversation_key(NB, "c")).write(".ssh/id_rsa", b"x\n")

    class B:
        workspace_tools = env.tools

    with pytest.raises(WorkspaceRefusal) as exc:
        asyncio.run(wm.workspace_diff(B(), caller, wm.WorkspaceDiffParams(conversation="c", path=".ssh/id_rsa")))
    assert exc.value.code.value == "PATH_REFUSED" and "credential" in exc.value.message


def test_tools_call_without_the_runtime_applies_the_per_call_class(env) -> None:
    """The broker's own tools.call path (no runtime wired) asks for a pull outside the read roots too."""
    from relay_jupyter.broker.broker import Broker
    from relay_jupyter.broker.config import BrokerConfig
    from relay_jupyter.broker.dispatch import call_method
    from relay_jupyter.core.caller import Caller, CallerKind
    from relay_jupyter.core.types import Grant
    from relay_jupyter.protocol.names import EventType

    caller = Caller(kind=CallerKind.KERNEL, origin=NB, client_id="kernel:k")
    broker = Broker.open(BrokerConfig(in_memory=True, consent_timeout=5))
    broker.workspace_tools = env.tools
    assert getattr(broker, "client_tools", None) is None
    broker.grants.issue(Grant(origin=NB, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="click"))

    async def go():
        inside = await call_method(broker, caller, "tools.call", {"conversation": "c", "tool": "scratch_pull",
                                                                  "arguments": {"source": "proj/data/x.csv", "path": "a"}})
        assert not inside["is_error"]
        assert not [e for e in broker.store.events_since(0) if e.type == EventType.PERMISSION_REQUEST]
        task = asyncio.create_task(call_method(broker, caller, "tools.call", {
            "conversation": "c", "tool": "scratch_pull", "arguments": {"source": "other/notes.txt", "path": "b"}}))
        async with asyncio.timeout(10):
            while not (asked := [e for e in broker.store.events_since(0) if e.type == EventType.PERMISSION_REQUEST]):
                await asyncio.sleep(0.01)
        assert asked[0].data["tool_class"] == "write" and "other/notes.txt" in "\n".join(asked[0].data["reasons"])
        await call_method(broker, caller, "permission.answer", {"request_id": asked[0].data["request_id"],
                                                                 "decision": "deny", "scope": "once"})
        with pytest.raises(Exception) as exc:
            await task
        assert "CONSENT_DENIED" in repr(exc.value) or "denied" in str(exc.value).lower()

    try:
        asyncio.run(go())
        from relay_jupyter.broker.conversation_keys import conversation_key

        ws = env.tools.manager.for_conversation(conversation_key(NB, "c"))
        assert ws.exists("a") and not ws.exists("b")
    finally:
        broker.close()
