"""Wire models of ``checkpoints.list``, ``checkpoints.revert`` and ``workspace.diff`` (docs/workspace.md)."""

from __future__ import annotations

from pydantic import Field

from .models_runs import ConversationName
from .strict import Strict

__all__ = [
    "CheckpointInfo", "CheckpointsListParams", "CheckpointsListResult", "CheckpointsRevertParams",
    "CheckpointsRevertResult", "WorkspaceDiffParams", "WorkspaceDiffResult",
]


class CheckpointInfo(Strict):
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


class CheckpointsListParams(Strict):
    origin: str | None = None
    """Browser sessions name the notebook origin; kernels and daemon clients get their own."""
    limit: int = Field(default=100, ge=1, le=1000)


class CheckpointsListResult(Strict):
    checkpoints: list[CheckpointInfo]
    """Newest first."""


class CheckpointsRevertParams(Strict):
    id: str = Field(min_length=1, max_length=64)
    origin: str | None = None


class CheckpointsRevertResult(Strict):
    reverted: list[str]
    """Ids restored, newest first (also on partial progress)."""
    stopped_at: str | None = None
    """The step whose live file no longer matched its post-image (nothing restored from it on)."""
    reason: str | None = None
    complete: bool


class WorkspaceDiffParams(Strict):
    conversation: ConversationName
    """The caller's conversation name (as in ``run.start``, same pattern); the broker keys the workspace
    by the pair (caller's origin, name)."""
    path: str = Field(min_length=1, max_length=4096)
    """Relative path, both in the scratch workspace and in the Jupyter root."""
    origin: str | None = None
    """Browser sessions name the notebook origin; kernels and daemon clients get their own."""


class WorkspaceDiffResult(Strict):
    path: str
    diff: str
    """Unified diff ``a/<path>`` (Jupyter root) -> ``b/<path>`` (workspace); empty when equal or not text."""
    target_exists: bool
    note: str = ""
    """Why ``diff`` is empty or cut (equal, binary, too large)."""
