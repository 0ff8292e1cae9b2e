"""``checkpoints.list`` and ``checkpoints.revert``: the journal of pushes, and undoing them.

Uses two broker slots (None answers ``UNAVAILABLE``): ``broker.checkpoints``
(``storage.checkpoints.CheckpointJournal``) and ``broker.workspace_tools`` (``workspace.tools.WorkspaceTools``,
which performs the revert under its push lock).

Access (:data:`~._access.NOTEBOOK`): a caller sees and reverts only checkpoints of its own origin; a
browser session names the origin it acts for. Another origin's checkpoint looks missing.
"""

from __future__ import annotations

from typing import Any

from ...core.errors import Code, RoutingRefusal
from ...protocol.models_workspace import (
    CheckpointInfo,
    CheckpointsListParams,
    CheckpointsListResult,
    CheckpointsRevertParams,
    CheckpointsRevertResult,
)
from ...protocol.names import EventType, Method
from ..conversation_keys import conversation_name
from ._access import NOTEBOOK, Namespace, Request

__all__ = [
    "ACCESS", "CheckpointInfo", "CheckpointsListParams", "CheckpointsListResult", "CheckpointsRevertParams",
    "CheckpointsRevertResult", "checkpoints_list", "checkpoints_revert", "rpc",
]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "checkpoints")


def _journal(req: Request) -> Any:
    from ..broker import require

    return require(req.broker.checkpoints, "the checkpoint journal")


@rpc.method(Method.CHECKPOINTS_LIST, CheckpointsListParams, CheckpointsListResult,
            doc="Pushes of the caller's origin, newest first, with their state.")
async def checkpoints_list(req: Request, params: CheckpointsListParams) -> CheckpointsListResult:
    """List the checkpoints of the caller's origin."""
    infos = []
    for c in _journal(req).list(origin=req.target, limit=params.limit):
        pub = c.public()
        if pub.get("conversation"):  # the client's name, not the broker's (origin, name) key
            pub["conversation"] = conversation_name(pub["conversation"], c.origin)
        infos.append(CheckpointInfo(**pub))
    return CheckpointsListResult(checkpoints=infos)


@rpc.method(Method.CHECKPOINTS_REVERT, CheckpointsRevertParams, CheckpointsRevertResult,
            doc="Revert a checkpoint and every later one of the same origin, newest first; each step checks "
                "the live file still equals its post-image and stops (partial progress) when it does not.")
async def checkpoints_revert(req: Request, params: CheckpointsRevertParams) -> CheckpointsRevertResult:
    """Revert from the newest checkpoint of the origin back to ``id``."""
    from ..broker import require

    origin = req.target
    journal = _journal(req)
    tools = require(req.broker.workspace_tools, "the scratch workspace")
    found = journal.get(params.id)
    if found is None or found.origin != origin:
        # Another origin's checkpoint looks exactly like a missing one.
        raise RoutingRefusal(Code.NOT_FOUND, f"no checkpoint {params.id!r} for this notebook", data={"id": params.id})
    outcome = await tools.revert(params.id, origin=origin)
    req.audit(Method.CHECKPOINTS_REVERT, {"id": params.id, "reverted": outcome["reverted"]},
              decision="ok" if outcome["complete"] else "partial")
    if req.broker.events is not None:  # unit tests drive these handlers over a broker without a bus
        req.broker.events.append(EventType.CHECKPOINT, {"action": "revert", **outcome}, origin=origin)
    return CheckpointsRevertResult(**outcome)
