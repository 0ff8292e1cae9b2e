"""``workspace.diff``: a scratch file against the Jupyter-root file of the same path (``relay.diff(path)``).

Uses ``broker.workspace_tools`` (``workspace.tools.WorkspaceTools``; None answers ``UNAVAILABLE``).

Access (:data:`~._access.NOTEBOOK`): a caller diffs only its own origin's conversation workspaces (the
workspace is keyed by the pair (origin, name)); a browser session names the origin.
"""

from __future__ import annotations

import asyncio

from ...core.errors import Code, WorkspaceRefusal
from ...protocol.models_workspace import WorkspaceDiffParams, WorkspaceDiffResult
from ...protocol.names import Method
from ..conversation_keys import conversation_key
from ._access import NOTEBOOK, Namespace, Request

__all__ = ["ACCESS", "WorkspaceDiffParams", "WorkspaceDiffResult", "rpc", "workspace_diff"]

ACCESS = NOTEBOOK
rpc = Namespace(ACCESS, "workspace")


@rpc.method(Method.WORKSPACE_DIFF, WorkspaceDiffParams, WorkspaceDiffResult,
            doc="Unified diff of the caller's scratch file against the Jupyter-root file of the same relative path.")
async def workspace_diff(req: Request, params: WorkspaceDiffParams) -> WorkspaceDiffResult:
    """Diff ``path`` of the caller's own conversation workspace against the Jupyter root (read only).

    Raises:
        WorkspaceRefusal: PATH_REFUSED (traversal, protected target), NOT_FOUND (no such scratch file).
    """
    from ...workspace.tools import MAX_PREVIEW_DIFF_INPUT, MAX_RESULT_DIFF
    from ..broker import require

    tools = require(req.broker.workspace_tools, "the scratch workspace")
    key = conversation_key(req.target, params.conversation)

    def compute() -> WorkspaceDiffResult:
        from ...core.diff import unified_diff
        from ...core.wspaths import split_relpath

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
