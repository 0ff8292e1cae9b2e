"""``relay``: the object put in the user namespace by ``%load_ext relay_jupyter``.

- ``relay.grants()``: the grants table, with a Revoke button per row.
- ``relay.budget()``: meters for tokens and estimated cost used against the limit, and requests/min.
- ``relay.audit(n)`` / ``relay.runs(n)``: pandas DataFrames.
- ``relay.run(run_id)``: one run's steps, tool calls, decisions and timings.
- ``relay.diff(path)``: the diff viewer for a workspace file against its target in the Jupyter root;
  ``relay.diff(old_text, new_text)`` for two strings.

These are ordinary (synchronous) calls from a cell. A cell's code runs while the kernel's own
event loop is busy running that cell, so each call runs its short RPC on a private loop in a worker
thread and waits for it; the kernel's loop is never re-entered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import difflib
from typing import Any

from ..protocol.names import Method
from .errors import AgentError, RpcError

__all__ = ["Relay"]

_TIMEOUT = 30.0


def _rows(result: Any, *keys: str) -> list[dict[str, Any]]:
    """The list of records inside an RPC result, whatever its key (``records``, ``runs``, ...)."""
    if isinstance(result, list):
        return [r for r in result if isinstance(r, dict)]
    if isinstance(result, dict):
        for key in keys:
            if isinstance(result.get(key), list):
                return [r for r in result[key] if isinstance(r, dict)]
        for value in result.values():
            if isinstance(value, list):
                return [r for r in value if isinstance(r, dict)]
    return []


class Relay:
    """Grants, budgets, audit, runs and diffs of this notebook, from the broker."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def __repr__(self) -> str:
        return "relay: grants() budget() audit() runs() run(run_id) diff(path)"

    def _call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        async def go() -> Any:
            client = await self._session.get_client()
            return await client.call(method, params or {})

        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-rpc") as pool:
            future = pool.submit(asyncio.run, go())
            try:
                return future.result(timeout=_TIMEOUT + 5)
            except concurrent.futures.TimeoutError:
                raise AgentError(f"the relay broker did not answer {method} in time") from None

    async def _revoke(self, origin: str) -> None:
        client = await self._session.get_client()
        await client.call(Method.GRANTS_REVOKE, {"origin": origin})
        self._session.connected_origin = False

    def grants(self) -> None:
        """Show this notebook's grants with a Revoke button each."""
        from .widgets.tables import GrantsTable

        GrantsTable(_rows(self._call(Method.GRANTS_LIST), "grants"), self._revoke).show()

    def budget(self) -> None:
        """Show budget meters: tokens and estimated cost used today against the limits, requests/minute."""
        from .widgets.tables import BudgetMeters

        info = self._call(Method.BUDGET_GET)
        BudgetMeters(info if isinstance(info, dict) else {}).show()

    def audit(self, n: int = 100) -> Any:
        """The last ``n`` audit records as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(_rows(self._call(Method.AUDIT_TAIL, {"n": int(n)}), "records", "audit"))

    def runs(self, n: int = 50) -> Any:
        """The last ``n`` runs as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(_rows(self._call(Method.RUNS_LIST, {"limit": int(n)}), "runs"))

    def run(self, run_id: str) -> Any:
        """One run's view: steps, tool calls, decisions, timings."""
        from .widgets.tables import RunView

        result = self._call(Method.RUNS_GET, {"run_id": run_id})
        run = result.get("run", result) if isinstance(result, dict) else {}
        return RunView(run if isinstance(run, dict) else {})

    def diff(self, path: str, new: str | None = None, *, chat: str = "default") -> Any:
        """A diff viewer. ``diff(path)``: the workspace copy of ``path`` against its target (from the
        broker); ``diff(old_text, new_text)``: two strings, diffed here."""
        from .widgets.diff_view import DiffView

        if new is not None:
            lines = difflib.unified_diff(path.splitlines(keepends=True), new.splitlines(keepends=True),
                                         "a", "b")
            return DiffView("".join(lines))
        chat_state = self._session.book.chats.get(chat)
        conversation = chat_state.conversation if chat_state else chat
        try:
            result = self._call(Method.WORKSPACE_DIFF, {"conversation": conversation, "path": path})
        except RpcError as exc:
            if exc.rpc_code == -32601:
                raise AgentError("this broker has no workspace diff (workspace.diff); update relay-jupyter") \
                    from None
            raise
        diff = result.get("diff", "") if isinstance(result, dict) else str(result or "")
        return DiffView(str(diff), path)
