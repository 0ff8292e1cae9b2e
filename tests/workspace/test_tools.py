"""Scratch tools end to end on real files: edit, pull, push consent data, digests, checkpoints, revert."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from relay_jupyter.broker.methods import checkpoints as wm
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import RoutingRefusal, WorkspaceRefusal
from relay_jupyter.core.memory import MemoryAuditSink
from relay_jupyter.core.protected import ProtectedPaths
from relay_jupyter.core.types import ToolClass
from relay_jupyter.storage.checkpoints import CheckpointJournal
from relay_jupyter.workspace.scratch import WorkspaceManager
from relay_jupyter.workspace.tools import WorkspaceTools

ORIGIN = "notebook:a.ipynb#k1"


@pytest.fixture
def env(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    data = tmp_path / "data"
    journal = CheckpointJournal(data / "relay.db")
    protected = ProtectedPaths.for_jupyter(root, data_dir=data, config_dirs=[tmp_path / "cfg"],
                                           runtime_dir=tmp_path / "rt")
    tools = WorkspaceTools(WorkspaceManager(data / "workspaces"), root, journal, protected)
    yield SimpleNamespace(root=root, tools=tools, journal=journal)
    journal.close()


def run(coro):
    return asyncio.run(coro)


async def push(tools: WorkspaceTools, path: str, target: str, run_id: str = "r1", origin: str = ORIGIN):
    _reasons, preview = await tools.preflight("c1", "scratch_push", {"path": path, "target": target})
    return await tools.call("c1", "scratch_push", {"path": path, "target": target}, run_id=run_id,
                            origin=origin, approved_preview=preview)


def test_specs_classes() -> None:
    tools = {s.name: s for s in WorkspaceTools.specs(None)}  # type: ignore[arg-type]
    assert tools["scratch_edit"].tool_class is ToolClass.CONTAINED
    assert tools["scratch_pull"].tool_class is ToolClass.READ
    assert tools["scratch_push"].tool_class is ToolClass.WRITE and not tools["scratch_push"].parallel_safe
    assert all(s.parallel_safe for n, s in tools.items() if n != "scratch_push")


def test_pull_edit_returns_diff_not_file(env) -> None:
    (env.root / "cfg.txt").write_bytes(b"a = 1\r\nb = 2\r\n")
    t = env.tools
    run(t.call("c1", "scratch_pull", {"source": "cfg.txt", "path": "cfg.txt"}))
    out = run(t.call("c1", "scratch_edit", {"path": "cfg.txt", "edits": [{"old_text": "b = 2", "new_text": "b = 3"}]}))
    assert "-b = 2\r\n+b = 3\r\n" in out["content"] and out["first_changed_line"] == 2
    assert run(t.call("c1", "scratch_read", {"path": "cfg.txt"}))["content"] == "a = 1\r\nb = 3\r\n"
    with pytest.raises(WorkspaceRefusal) as exc:
        run(t.call("c1", "scratch_edit", {"path": "cfg.txt", "edits": [{"old_text": "zzz", "new_text": ""}]}))
    assert exc.value.code.value == "EDIT_NO_MATCH"


def test_pull_refuses_protected_sources(env) -> None:
    (env.root / ".git").mkdir()
    (env.root / ".git" / "config").write_text("x")
    for source in (".git/config", "../x", "MCP.json"):
        with pytest.raises(WorkspaceRefusal) as exc:
            run(env.tools.preflight("c1", "scratch_pull", {"source": source, "path": "x"}))
        assert exc.value.code.value == "PATH_REFUSED"


def test_push_card_and_checkpoint_revert(env) -> None:
    t = env.tools
    (env.root / "notes.md").write_text("old\n")
    run(t.call("c1", "scratch_write", {"path": "n.md", "content": "new\napi_key = sk-abcdefghijklmnopqrstu\n"}))
    reasons, preview = run(t.preflight("c1", "scratch_push", {"path": "n.md", "target": "notes.md"}))
    assert preview["target"] == "notes.md" and preview["size"] == len(b"new\napi_key = sk-abcdefghijklmnopqrstu\n")
    assert preview["target_sha256"] is not None and len(preview["sha256"]) == 64
    assert "sk-abc" not in "".join(preview["head"]) and "sk-abc" not in "".join(reasons)
    assert "-old\n+new\n" in preview["diff"]
    out = run(t.call("c1", "scratch_push", {"path": "n.md", "target": "notes.md"}, run_id="r1", origin=ORIGIN,
                     approved_preview=preview))
    assert (env.root / "notes.md").read_text().startswith("new\n")
    ckpt = out["checkpoint"]
    assert env.journal.get(ckpt).state == "applied"
    res = run(t.revert(ckpt, origin=ORIGIN))
    assert res == {"reverted": [ckpt], "stopped_at": None, "reason": None, "complete": True}
    assert (env.root / "notes.md").read_text() == "old\n"
    assert env.journal.get(ckpt).state == "reverted"


def test_digest_mismatch_writes_nothing(env) -> None:
    t = env.tools
    (env.root / "t.txt").write_text("v1\n")
    run(t.call("c1", "scratch_write", {"path": "w.txt", "content": "mine\n"}))
    _r, preview = run(t.preflight("c1", "scratch_push", {"path": "w.txt", "target": "t.txt"}))
    run(t.call("c1", "scratch_write", {"path": "w.txt", "content": "rewritten after approval\n"}))
    with pytest.raises(WorkspaceRefusal) as exc:
        run(t.call("c1", "scratch_push", {"path": "w.txt", "target": "t.txt"}, run_id="r", origin=ORIGIN,
                   approved_preview=preview))
    assert exc.value.code.value == "DIGEST_MISMATCH"
    _r, preview = run(t.preflight("c1", "scratch_push", {"path": "w.txt", "target": "t.txt"}))
    (env.root / "t.txt").write_text("changed by the user\n")
    with pytest.raises(WorkspaceRefusal) as exc:
        run(t.call("c1", "scratch_push", {"path": "w.txt", "target": "t.txt"}, run_id="r", origin=ORIGIN,
                   approved_preview=preview))
    assert exc.value.code.value == "DIGEST_MISMATCH"
    with pytest.raises(WorkspaceRefusal):  # no approval at all
        run(t.call("c1", "scratch_push", {"path": "w.txt", "target": "t.txt"}, run_id="r", origin=ORIGIN))
    assert (env.root / "t.txt").read_text() == "changed by the user\n"
    assert env.journal.list() == []


def test_protected_target_refused_even_with_approval(env) -> None:
    t = env.tools
    run(t.call("c1", "scratch_write", {"path": "x", "content": "x"}))
    forged = {"path": "x", "target": ".git/config", "workspace_sha256": "0" * 64, "target_sha256": None}
    for target in (".git/config", ".Git/HEAD", "sub/mcp.json", ".ipynb_checkpoints/a", "../escape"):
        with pytest.raises(WorkspaceRefusal) as exc:
            run(t.call("c1", "scratch_push", {"path": "x", "target": target}, run_id="r", origin=ORIGIN,
                       approved_preview={**forged, "target": target}))
        assert exc.value.code.value == "PATH_REFUSED"
    assert not (env.root / ".git").exists()


def test_revert_cascade_stops_on_a_changed_file(env) -> None:
    t = env.tools
    (env.root / "a.txt").write_text("a0\n")
    run(t.call("c1", "scratch_write", {"path": "a", "content": "a1\n"}))
    run(t.call("c1", "scratch_write", {"path": "b", "content": "b1\n"}))
    first = run(push(t, "a", "a.txt", run_id="r1"))["checkpoint"]
    run(t.call("c1", "scratch_write", {"path": "a", "content": "a2\n"}))
    again = run(push(t, "a", "a.txt", run_id="r1"))["checkpoint"]
    assert again == first  # one checkpoint per (run, target): the pre-image of the first push
    second = run(push(t, "b", "new/b.txt", run_id="r2"))["checkpoint"]
    third = run(push(t, "a", "a.txt", run_id="r3"))["checkpoint"]
    (env.root / "new" / "b.txt").write_text("user edit\n")
    res = run(t.revert(first, origin=ORIGIN))
    assert res["reverted"] == [third] and res["stopped_at"] == second and not res["complete"]
    assert (env.root / "a.txt").read_text() == "a2\n"  # third's pre-image (a2), not further
    (env.root / "new" / "b.txt").write_text("b1\n")
    res = run(t.revert(first, origin=ORIGIN))
    assert res["reverted"] == [second, first] and res["complete"]
    assert (env.root / "a.txt").read_text() == "a0\n" and not (env.root / "new" / "b.txt").exists()
    with pytest.raises(RoutingRefusal):
        run(t.revert(first, origin="notebook:other.ipynb#k9"))


def test_crash_between_steps_is_reconciled(env) -> None:
    t, j = env.tools, env.journal
    (env.root / "f.txt").write_text("pre\n")
    landed = j.prepare(origin=ORIGIN, conversation="c1", run_id="r1", target="f.txt", pre_image=b"pre\n",
                       pending_sha256=__import__("hashlib").sha256(b"post\n").hexdigest())
    (env.root / "f.txt").write_text("post\n")  # the write happened, then the process died
    (env.root / "g.txt").write_text("g\n")
    never = j.prepare(origin=ORIGIN, conversation="c1", run_id="r1", target="g.txt", pre_image=b"g\n",
                      pending_sha256="f" * 64)
    decisions = {d["id"]: d["decision"] for d in t.reconcile()}
    assert decisions == {landed.id: "applied", never.id: "reverted"}
    assert j.get(landed.id).post_sha256 == landed.pending_sha256
    j.mark_reverting(landed.id)  # crash in the middle of a revert, before the restore
    assert {d["id"]: d["decision"] for d in t.reconcile()} == {landed.id: "applied"}
    assert run(t.revert(landed.id, origin=ORIGIN))["complete"]
    assert (env.root / "f.txt").read_text() == "pre\n"


def test_broker_methods_scope_to_origin(env) -> None:
    t = env.tools
    run(t.call("c1", "scratch_write", {"path": "a", "content": "1\n"}))
    ckpt = run(push(t, "a", "a.txt"))["checkpoint"]
    broker = SimpleNamespace(checkpoints=env.journal, workspace_tools=t, audit=MemoryAuditSink(), events=None)
    mine = Caller(kind=CallerKind.KERNEL, origin=ORIGIN, client_id="k")
    other = Caller(kind=CallerKind.KERNEL, origin="notebook:b.ipynb#k2", client_id="k2")
    listed = run(wm.checkpoints_list(broker, mine, wm.CheckpointsListParams()))
    assert [c.id for c in listed.checkpoints] == [ckpt] and listed.checkpoints[0].state == "applied"
    assert run(wm.checkpoints_list(broker, other, wm.CheckpointsListParams())).checkpoints == []
    with pytest.raises(RoutingRefusal):
        run(wm.checkpoints_revert(broker, other, wm.CheckpointsRevertParams(id=ckpt)))
    res = run(wm.checkpoints_revert(broker, mine, wm.CheckpointsRevertParams(id=ckpt)))
    assert res.complete and res.reverted == [ckpt] and not (env.root / "a.txt").exists()
    with pytest.raises(Exception):
        wm.CheckpointsRevertParams(id=ckpt, extra=1)  # type: ignore[call-arg]
