"""``checkpoints.list`` and ``checkpoints.revert``: the journal of pushes, and undoing them;
``workspace.diff``: a scratch file against the Jupyter-root file of the same path (``relay.diff(path)``).

Expects two broker attributes (wired by the broker when the workspace is available; None answers
``UNAVAILABLE``): ``broker.checkpoints`` (``storage.checkpoints.CheckpointJournal``) and
``broker.workspace_tools`` (``workspace.tools.WorkspaceTools``, which performs the revert under its
push lock). A caller sees and reverts only checkpoints of its own origin; a browser session names
the origin it acts for (``target_origin``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ..core.caller import Caller
from ..core.errors import Code, RoutingRefusal, WorkspaceRefusal
from ..core.types import AuditRecord
from ..protocol.models_runs import ConversationName
from ..protocol.names import EventType, Method
from .conversation_keys import conversation_key, conversation_name
from .registry import method

if TYPE_CHECKING:
    from .broker import Broker

__all__ = [
    "CheckpointInfo", "CheckpointsListParams", "CheckpointsListResult", "CheckpointsRevertParams",
    "CheckpointsRevertResult", "WorkspaceDiffParams", "WorkspaceDiffResult",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckpointInfo(_Strict):
    """One push's checkpoint as a client sees it (no file bytes)."""

    id: str
    target: str
    """Path relative to the Jupyter root."""
    state: str
    """``prepared`` | ``applied`` | ``reverting`` | ``reverted``."""
    run_id: str
    conversation: str | None = None
    created_at: float
    updated_at: float
    pre_exists: bool
    """False when the push created the file (a revert deletes it)."""
    pre_sha256: str | None = None
    post_sha256: str | None = None
    note: str = ""


class CheckpointsListParams(_Strict):
    origin: str | None = None
    """Browser sessions name the notebook origin; kernels and daemon clients get their own."""
    limit: int = Field(default=100, ge=1, le=1000)


class CheckpointsListResult(_Strict):
    checkpoints: list[CheckpointInfo]
    """Newest first."""


class CheckpointsRevertParams(_Strict):
    id: str = Field(min_length=1, max_length=64)
    origin: str | None = None


class CheckpointsRevertResult(_Strict):
    reverted: list[str]
    """Ids restored, newest first (also on partial progress)."""
    stopped_at: str | None = None
    """The step whose live file no longer matched its post-image (nothing restored from it on)."""
    reason: str | None = None
    complete: bool


class WorkspaceDiffParams(_Strict):
    conversation: ConversationName
    """The caller's conversation name (as in ``run.start``, same pattern); the broker keys the workspace
    by the pair (caller's origin, name)."""
    path: str = Field(min_length=1, max_length=4096)
    """Relative path, both in the scratch workspace and in the Jupyter root."""
    origin: str | None = None
    """Browser sessions name the notebook origin; kernels and daemon clients get their own."""


class WorkspaceDiffResult(_Strict):
    path: str
    diff: str
    """Unified diff ``a/<path>`` (Jupyter root) -> ``b/<path>`` (workspace); empty when equal or not text."""
    target_exists: bool
    note: str = ""
    """Why ``diff`` is empty or cut (equal, binary, too large)."""


def _origin(caller: Caller, requested: str | None) -> str:
    from .broker import target_origin

    return target_origin(caller, requested)


def _journal(broker: Broker) -> Any:
    from .broker import require

    return require(getattr(broker, "checkpoints", None), "the checkpoint journal")


@method(Method.CHECKPOINTS_LIST, CheckpointsListParams, CheckpointsListResult,
        doc="Pushes of the caller's origin, newest first, with their state.")
async def checkpoints_list(broker: Broker, caller: Caller, params: CheckpointsListParams) -> CheckpointsListResult:
    """List the checkpoints of the caller's origin."""
    origin = _origin(caller, params.origin)
    rows = _journal(broker).list(origin=origin, limit=params.limit)
    infos = []
    for c in rows:
        pub = c.public()
        if pub.get("conversation"):  # the client's name, not the broker's (origin, name) key
            pub["conversation"] = conversation_name(pub["conversation"], c.origin)
        infos.append(CheckpointInfo(**pub))
    return CheckpointsListResult(checkpoints=infos)


@method(Method.CHECKPOINTS_REVERT, CheckpointsRevertParams, CheckpointsRevertResult,
        doc="Revert a checkpoint and every later one of the same origin, newest first; each step checks "
            "the live file still equals its post-image and stops (partial progress) when it does not.")
async def checkpoints_revert(broker: Broker, caller: Caller, params: CheckpointsRevertParams
                             ) -> CheckpointsRevertResult:
    """Revert from the newest checkpoint of the origin back to ``id``."""
    from .broker import require

    origin = _origin(caller, params.origin)
    journal = _journal(broker)
    tools = require(getattr(broker, "workspace_tools", None), "the scratch workspace")
    found = journal.get(params.id)
    if found is None or found.origin != origin:
        # Another origin's checkpoint looks exactly like a missing one.
        raise RoutingRefusal(Code.NOT_FOUND, f"no checkpoint {params.id!r} for this notebook", data={"id": params.id})
    outcome = await tools.revert(params.id, origin=origin)
    broker.audit.append(AuditRecord(ts=time.time(), origin=origin, tool=Method.CHECKPOINTS_REVERT,
                                    decision="ok" if outcome["complete"] else "partial",
                                    answered_by=caller.client_id,
                                    arguments={"id": params.id, "reverted": outcome["reverted"]}))
    events = getattr(broker, "events", None)
    if events is not None:
        events.append(EventType.CHECKPOINT, {"action": "revert", **outcome}, origin=origin)
    return CheckpointsRevertResult(**outcome)


@method(Method.WORKSPACE_DIFF, WorkspaceDiffParams, WorkspaceDiffResult,
        doc="Unified diff of the caller's scratch file against the Jupyter-root file of the same relative path.")
async def workspace_diff(broker: Broker, caller: Caller, params: WorkspaceDiffParams) -> WorkspaceDiffResult:
    """Diff ``path`` of the caller's own conversation workspace against the Jupyter root (read only).

    Raises:
        WorkspaceRefusal: PATH_REFUSED (traversal, protected target), NOT_FOUND (no such scratch file).
    """
    import asyncio

    from ..workspace.tools import MAX_PREVIEW_DIFF_INPUT, MAX_RESULT_DIFF
    from .broker import require

    origin = _origin(caller, params.origin)
    tools = require(getattr(broker, "workspace_tools", None), "the scratch workspace")
    key = conversation_key(origin, params.conversation)

    def compute() -> WorkspaceDiffResult:
        from ..core.diff import unified_diff
        from ..core.wspaths import split_relpath

        split_relpath(params.path)  # traversal and malformed paths refused before touching anything
        tools.files.check(params.path)  # protected Jupyter-root paths are not shown either
        if not tools.manager.root_for(key).exists():
            # looking must not create a workspace for a conversation that never had one
            raise WorkspaceRefusal(Code.NOT_FOUND, f"{params.path!r} is not in this conversation's workspace",
                                   data={"path": params.path})
        ws = tools.manager.for_conversation(key)
        # bound before work: both sizes from stat, nothing read when the diff would be over the limit
        new_size, old_size = ws.stat(params.path).st_size, tools.files.size(params.path)
        if new_size + (old_size or 0) > MAX_PREVIEW_DIFF_INPUT:
            return WorkspaceDiffResult(path=params.path, target_exists=old_size is not None, diff="",
                                       note=f"files too large to diff ({new_size + (old_size or 0)} bytes)")
        data = ws.read(params.path)
        current = tools.files.read(params.path)
        out = {"path": params.path, "target_exists": current is not None}
        old = current or b""
        if old == data:
            return WorkspaceDiffResult(**out, diff="", note="the Jupyter-root file has the same content")
        if not _is_text(old) or not _is_text(data):
            return WorkspaceDiffResult(**out, diff="", note="binary content: no text diff")
        if len(old) + len(data) > MAX_PREVIEW_DIFF_INPUT:
            return WorkspaceDiffResult(**out, diff="", note=f"files too large to diff ({len(old) + len(data)} bytes)")
        text = unified_diff(old, data, old_label=f"a/{params.path}", new_label=f"b/{params.path}").text.decode()
        if len(text) > MAX_RESULT_DIFF:
            return WorkspaceDiffResult(**out, diff=text[:MAX_RESULT_DIFF], note=f"cut at {MAX_RESULT_DIFF} characters")
        return WorkspaceDiffResult(**out, diff=text)

    return await asyncio.to_thread(compute)


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
