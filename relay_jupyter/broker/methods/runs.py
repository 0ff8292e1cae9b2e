"""``run.cancel``, ``runs.*`` (the run journal: list, get, cancel) and ``kill`` (stop every run of a notebook).

Access (:data:`~._access.RUNS`, one rule for ``run.*`` and ``runs.*``): a kernel sees its own origin's
runs, a browser session every origin's; another notebook's run looks missing (``NOT_FOUND``). A run is
cancelled only by its originator or a browser session (``RUNS.cancel``: ``run.cancel`` and
``runs.cancel`` are the same check; another client of the same notebook gets ``NOT_ORIGINATOR``).
``kill`` is the notebook's emergency stop: every run of one origin, whoever started it (default: the
caller's own origin; ``all: true``, browser sessions only, every origin).
"""

from __future__ import annotations

from ...protocol.models_control import (
    CancelledResult,
    KillParams,
    KillResult,
    RunsCancelParams,
    RunsGetParams,
    RunsGetResult,
    RunsListParams,
    RunsListResult,
)
from ...protocol.models_runs import RunCancelParams, RunCancelResult
from ...protocol.names import Method
from ._access import RUNS, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = RUNS
rpc = Namespace(ACCESS, "runs", "run", "kill")


@rpc.method(Method.RUN_CANCEL, RunCancelParams, RunCancelResult, scope=Scope.ANY,
            doc="Cancel a run: only its originator or a browser session of the server's user (as runs.cancel). "
                "False when it already ended.")
async def run_cancel(req: Request, params: RunCancelParams) -> RunCancelResult:
    return RunCancelResult(cancelled=ACCESS.cancel(req, params.run_id))


@rpc.method(Method.RUNS_LIST, RunsListParams, RunsListResult, scope=Scope.ANY,
            doc="Runs from the journal, newest first: a kernel sees its own origin's.")
async def runs_list(req: Request, params: RunsListParams) -> RunsListResult:
    return RunsListResult(runs=req.broker.store.list_runs(origin=req.origin, limit=params.limit))


@rpc.method(Method.RUNS_GET, RunsGetParams, RunsGetResult, scope=Scope.ANY, doc="One run with its calls.")
async def runs_get(req: Request, params: RunsGetParams) -> RunsGetResult:
    return RunsGetResult(run=ACCESS.run(req, params.run_id))


@rpc.method(Method.RUNS_CANCEL, RunsCancelParams, CancelledResult, scope=Scope.ANY,
            doc="Cancel a run: only its originator or a browser session of the server's user (as run.cancel). "
                "False when it already ended.")
async def runs_cancel(req: Request, params: RunsCancelParams) -> CancelledResult:
    return CancelledResult(cancelled=ACCESS.cancel(req, params.run_id))


@rpc.method(Method.KILL, KillParams, KillResult, scope=Scope.ALL,
            doc="Stop every run of one origin (default: the caller's own) or, browser only, of all origins; "
                "pending permission requests of those runs are denied.")
async def kill(req: Request, params: KillParams) -> KillResult:
    broker = req.broker
    denied = broker.permissions.deny_all(req.origin, answered_by=f"kill:{req.caller.client_id}")
    elicitations = getattr(broker, "elicitations", None)  # MCP servers' open questions are declined too
    if elicitations is not None:
        elicitations.decline_all(req.origin, answered_by=f"kill:{req.caller.client_id}")
    cancelled = len(broker.runs.kill(req.origin)) if broker.runs is not None else 0
    req.audit("kill", {"cancelled_runs": cancelled, "denied_requests": denied})
    return KillResult(cancelled_runs=cancelled, denied_requests=denied)
