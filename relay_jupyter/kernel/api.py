"""``relay``: the object put in the user namespace by ``%load_ext relay_jupyter``.

- ``relay.grants()``: the grants table, with a Revoke button per row.
- ``relay.budget()``: meters for tokens and estimated cost used against the limit, and requests/min.
- ``relay.audit(n)`` / ``relay.runs(n)``: pandas DataFrames.
- ``relay.run(run_id)``: one run's steps, tool calls, decisions and timings.
- ``relay.diff(path)``: the diff viewer for a workspace file against its target in the Jupyter root;
  ``relay.diff(old_text, new_text)`` for two strings.
- ``relay.connect(tools, ...)``: grant this notebook tools, models and a budget from code (the
  connect card's click, for headless runs: code the user runs in the kernel is the user).
- ``relay.checkpoints()`` / ``relay.revert(checkpoint_id)``: pushes into the Jupyter root, and undoing them.
- ``relay.kill()``: stop this notebook's runs and deny its pending requests.
- ``relay.provenance()``: what produced each ``%%agent`` answer of this notebook (run, model, backend, tokens,
  cost, tool calls with their decisions), read from the notebook's saved outputs (docs/provenance.md).
- ``relay.anthropic()`` / ``relay.async_anthropic()``: official ``anthropic`` SDK clients that reach Claude
  through relay's gate with this kernel's credential; ``relay.claude_env()``: the environment for a ``claude``
  CLI subprocess (``kernel/sdk_clients.py``, docs/proxy.md); ``relay.openai()`` / ``relay.async_openai()``: official
  ``openai`` SDK clients on relay's OpenAI-compatible endpoint (``relay/openai/v1``), the same way.
- ``relay.telemetry()``: this notebook's model requests (endpoints and ``%%agent`` turns) as a pandas DataFrame:
  tokens, cost, latency, time to first token, status, session, lineage; ``relay.spend()``: a matplotlib figure
  of spend and tokens over time per model (``kernel/telemetry_view.py``, docs/telemetry.md).

These are ordinary (synchronous) calls from a cell. A cell's code runs while the kernel's own
event loop is busy running that cell, so each call runs its short RPC on a private loop in a worker
thread and waits for it; the kernel's loop is never re-entered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from ..protocol.names import Method
from ..core.errors import RelayError
from .errors import AgentError, RpcError, as_agent_error

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
        return ("relay: connect(tools) grants() budget() audit() runs() run(run_id) diff(path) checkpoints() "
                "revert(checkpoint_id) kill() provenance() anthropic() async_anthropic() claude_env() openai() "
                "async_openai() telemetry() "
                "spend()")

    def _endpoint(self) -> Any:
        async def go() -> Any:
            return (await self._session.get_client()).endpoint

        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-rpc") as pool:
            return pool.submit(asyncio.run, go()).result(timeout=_TIMEOUT + 5)

    def kill(self) -> dict[str, int]:
        """Stop every run of this notebook and deny its pending permission requests (the side panel's
        "Stop all runs" does it for every notebook). Returns ``{cancelled_runs, denied_requests}``."""
        result = self._call(Method.KILL, {})
        return {"cancelled_runs": int(result.get("cancelled_runs", 0)),
                "denied_requests": int(result.get("denied_requests", 0))}

    def provenance(self, *, calls: bool = False, path: str | None = None) -> Any:
        """What produced each ``%%agent`` answer of this notebook, as a pandas DataFrame: one row per answer
        (run id, cell id, model, backend, outcome, tokens by kind, cost, duration, tool calls, checkpoints), or
        with ``calls=True`` one row per tool call (tool, class, decision, code, who decided, digests).

        Read from the notebook file's saved outputs (``path``, default: this kernel's notebook), plus this
        kernel's answers not saved yet; no tool arguments and nothing secret (docs/provenance.md).
        """
        import pandas as pd

        from .provenance import notebook_path, read_notebook, rows

        where = path if path is not None else notebook_path(getattr(self._session.shell, "user_ns", None))
        saved: list[dict[str, Any]] = []
        if where is not None:
            try:
                saved = read_notebook(where)
            except (OSError, ValueError) as exc:
                raise AgentError(f"relay.provenance: cannot read the notebook {str(where)!r} "
                                 f"({type(exc).__name__}: {exc})") from None
        known = {record.get("run_id") for record in saved}
        records = saved + [r for r in self._session.provenance if r.get("run_id") not in known]
        found = rows(records, calls=calls)
        return pd.DataFrame(found) if found else pd.DataFrame(columns=list(rows(
            [{"run_id": None, "tool_calls": [{}]}], calls=calls)[0]))

    def anthropic(self, **kwargs: Any) -> Any:
        """An ``anthropic.Anthropic`` client whose requests go through relay (grant, budget, audit; the broker's
        key). Keyword arguments go to the SDK (``max_retries``, ``timeout``, ...)."""
        from .sdk_clients import anthropic_client

        return anthropic_client(self._endpoint(), **kwargs)

    def async_anthropic(self, **kwargs: Any) -> Any:
        """The ``anthropic.AsyncAnthropic`` twin of :meth:`anthropic` (``await`` it in a cell)."""
        from .sdk_clients import anthropic_client

        return anthropic_client(self._endpoint(), asynchronous=True, **kwargs)

    def openai(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` client whose requests go through relay's OpenAI-compatible endpoint (grant, budget,
        audit; the broker's upstream and key). Keyword arguments go to the SDK (``profile=``, ``max_retries``, ...)."""
        from .sdk_clients import openai_client

        return openai_client(self._endpoint(), **kwargs)

    def async_openai(self, **kwargs: Any) -> Any:
        """The ``openai.AsyncOpenAI`` twin of :meth:`openai` (``await`` it in a cell)."""
        from .sdk_clients import openai_client

        return openai_client(self._endpoint(), asynchronous=True, **kwargs)

    def claude_env(self) -> dict[str, str]:
        """Environment for ``subprocess.run(["claude", "-p", ...], env=relay.claude_env())``: the CLI's model
        requests go through relay with this kernel's credential (its telemetry and updater off)."""
        from .sdk_clients import claude_env

        return claude_env(self._endpoint())

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
            except RelayError as exc:  # one family, one line (a core refusal included)
                error = as_agent_error(exc)
                if error is exc:
                    raise
                raise error from None

    async def _revoke(self, origin: str) -> None:
        client = await self._session.get_client()
        await client.call(Method.GRANTS_REVOKE, {"origin": origin})
        self._session.connected_origin = False

    def connect(self, tools: list[str] | tuple[str, ...], *, models: list[str] | tuple[str, ...] = ("*",),
                budget: dict[str, Any] | None = None, expires_in: float | None = None) -> dict[str, Any]:
        """Grant this notebook ``tools`` and ``models`` with ``budget`` limits (keys of the broker's Budget:
        ``tokens_per_day``, ``cost_per_day_usd``, ``requests_per_minute``, ``max_steps_per_run``,
        ``max_tokens_per_run``; None = no limit). What a Connect click does, for notebooks without a
        person (nbval, CI). Each call is a fresh consent and replaces the notebook's grant. Returns the grant.

        Raises:
            RpcError: the broker refused (bad tool or budget values).
        """
        params: dict[str, Any] = {"tools": list(tools), "models": list(models)}
        if budget is not None:
            params["budget"] = dict(budget)
        if expires_in is not None:
            params["expires_in"] = float(expires_in)
        result = self._call(Method.GRANTS_CREATE, params)
        self._session.connected_origin = True
        grant = result.get("grant", result) if isinstance(result, dict) else {}
        return grant if isinstance(grant, dict) else {}

    def sign_in(self, server: str, *, timeout: float = 600.0) -> dict[str, Any]:
        """Sign in to the HTTP MCP server ``server`` with OAuth: shows a card with the link, waits until the
        broker has the token (or ``timeout`` seconds). The token stays in the broker (docs/mcp.md).
        Returns ``{server, state: signed_in | failed | pending, message}``."""
        from .widgets.signin_card import SignInCard

        result = self._call(Method.MCP_SIGN_IN, {"server": server})
        card: SignInCard | None = None
        if result.get("state") == "pending":
            card = SignInCard(server, result.get("authorization_url"))
            card.show()
        deadline = time.monotonic() + timeout
        while result.get("state") == "pending" and time.monotonic() < deadline:
            result = self._call(Method.MCP_SIGN_IN_WAIT, {"sign_in_id": result["sign_in_id"],
                                                          "timeout": min(25.0, max(0.0, deadline - time.monotonic()))})
        state = result.get("state", "failed")
        message = str(result.get("message") or ("timed out" if state == "pending" else state))
        if card is not None:
            card.done(state == "signed_in", message)
        else:
            print(("✓ " if state == "signed_in" else "✗ ") + message)
        return {"server": server, "state": state, "message": message}

    def prompts(self, server: str | None = None) -> Any:
        """The MCP prompts this notebook can use with ``%agent --prompt server:name`` (those of the servers its
        grant reaches; one server's with ``server``) as a pandas DataFrame: prompt, description, arguments
        (``name?`` is optional)."""
        from .mcp_prompt import prompt_rows
        from .widgets.tables import frame

        params = {"server": server} if server is not None else {}
        return frame(prompt_rows(self._call(Method.MCP_PROMPTS_LIST, params)))

    def checkpoints(self, n: int = 100) -> Any:
        """This notebook's pushes into the Jupyter root (newest first) as a pandas DataFrame: id, target,
        state (``applied``, ``reverted``, ...), digests, times."""
        from .widgets.tables import frame

        return frame(_rows(self._call(Method.CHECKPOINTS_LIST, {"limit": int(n)}), "checkpoints"))

    def revert(self, checkpoint_id: str) -> dict[str, Any]:
        """Undo a push (and every later push of this notebook, newest first). Each step checks that the
        live file still equals what was pushed, and stops there otherwise. Returns
        ``{reverted, stopped_at, reason, complete}``."""
        result = self._call(Method.CHECKPOINTS_REVERT, {"id": str(checkpoint_id)})
        return result if isinstance(result, dict) else {}

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
        """The last ``n`` audit records as a pandas DataFrame (``ts`` as a local date-time)."""
        from .widgets.tables import frame

        return frame(_rows(self._call(Method.AUDIT_TAIL, {"n": int(n)}), "records", "audit"))

    def runs(self, n: int = 50) -> Any:
        """The last ``n`` runs as a pandas DataFrame (``started_at`` / ``finished_at`` as local date-times)."""
        from .widgets.tables import frame

        return frame(_rows(self._call(Method.RUNS_LIST, {"limit": int(n)}), "runs"))

    def telemetry(self, since: Any = None, *, limit: int = 1000) -> Any:
        """This notebook's model requests as a pandas DataFrame, one row each (oldest first; the newest
        ``limit``): ``ts`` (local time), ``source`` (``proxy``: an SDK, LangChain or the ``claude`` CLI through
        relay's endpoint; ``agent``: a ``%%agent`` turn), ``model``, ``session``, ``lineage``, the tokens and
        ``cost_usd`` charged (``estimated`` when the server reported none), ``latency_ms``, ``ttft_ms``,
        ``status``. ``since``: a ``datetime``, a ``timedelta`` (that long ago) or epoch seconds."""
        from .telemetry_view import since_seconds, telemetry_frame

        try:
            params: dict[str, Any] = {"limit": int(limit)}
            start = since_seconds(since)
        except (TypeError, ValueError) as exc:
            raise AgentError(f"relay.telemetry: {exc}") from None
        if start is not None:
            params["since"] = start
        return telemetry_frame(_rows(self._call(Method.TELEMETRY_QUERY, params), "rows"))

    def spend(self, since: Any = None, *, by: str = "model", limit: int = 10000) -> Any:
        """A matplotlib figure of this notebook's spend (cumulative USD) and tokens per request over time,
        one line per ``by`` (``model``, ``notebook``, ``session``, ``source``, ``status``); shown in the cell
        as a PNG, and returned (``fig.savefig(...)``). ``since`` as for :meth:`telemetry`."""
        from .telemetry_view import GROUPS, register_png_formatter, spend_figure

        if by not in GROUPS:
            raise AgentError(f"relay.spend: by must be one of {', '.join(sorted(GROUPS))}, not {by!r}")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise AgentError("relay.spend needs matplotlib: pip install matplotlib "
                             "(or relay-jupyter[plots])") from None
        df = self.telemetry(since, limit=limit)
        register_png_formatter(getattr(self._session, "shell", None))
        return spend_figure(df, by=by)

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
            # the broker's diff engine (GNU ``diff -u`` output, byte for byte), not difflib (issue 14.7)
            from ..core.diff import unified_diff

            text = unified_diff(path.encode(), new.encode(), old_label="a", new_label="b").text
            return DiffView(text.decode("utf-8", errors="replace"))
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
