"""``run.start``, ``run.cancel``, ``runs.*`` (the run journal: list, get, cancel) and ``kill`` (stop every run of
a notebook). The runtime is wired into a broker by ``broker/runtime_setup.install_runtime``.

Access (:data:`~._access.RUNS`, one rule for ``run.*`` and ``runs.*``): a kernel sees its own origin's
runs, a browser session every origin's; another notebook's run looks missing (``NOT_FOUND``). A run is
cancelled only by its originator or a browser session (``RUNS.cancel``: ``run.cancel`` and
``runs.cancel`` are the same check; another client of the same notebook gets ``NOT_ORIGINATOR``).
``run.start``: a kernel or daemon client runs for its own origin; a browser session names one; the
caller becomes the run's originator (only it answers the run's permission requests and cancels it).
``kill`` is the notebook's emergency stop: every run of one origin, whoever started it (default: the
caller's own origin; ``all: true``, browser sessions only, every origin).
"""

from __future__ import annotations

from ...backends.registry import spec as backend_spec
from ...core.errors import Code, ConfigRefusal, GateRefusal
from ...core.types import PermissionMode
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
from ...protocol.models_runs import RunCancelParams, RunCancelResult, RunStartParams, RunStartResult
from ...protocol.names import Method
from ...runtime.manager import RunContext, RunManager, RunParams
from ...runtime.offload import off_loop
from ..conversation_keys import conversation_key
from ._access import RUNS, Namespace, Request, Scope

__all__ = ["ACCESS", "rpc"]

ACCESS = RUNS
rpc = Namespace(ACCESS, "runs", "run", "kill")


def _runtime(req: Request) -> RunManager:
    from ..broker import require

    return require(req.broker.runs, "the agent runtime")


@rpc.method(Method.RUN_START, RunStartParams, RunStartResult,
            doc="Start an agent run in a conversation; events carry its progress and exactly one terminal event.")
async def run_start(req: Request, params: RunStartParams) -> RunStartResult:
    broker, caller, origin = req.broker, req.caller, req.target
    runs = _runtime(req)
    key = conversation_key(origin, params.conversation)
    # the conversation's owner is checked by RunManager.start, in its one store call off the event loop (it
    # loads the history the run needs first anyway): a conversation of another notebook is NOT_FOUND
    policy = broker.grants.policy  # the admin policy's run modes (core/admin_policy.py)
    refused = policy.refusal(params.mode) if policy is not None else None
    if refused is not None:
        raise GateRefusal(Code.SCOPE_EXCEEDED, refused, data={"mode": params.mode})
    backend = params.backend or broker.config.default_backend
    engine = params.engine or broker.config.default_engine
    if params.profile is not None:  # %%agent --profile: the run's backend over the profile's upstream
        if engine not in ("relay", "claude-code"):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"a profile applies to the relay and claude-code engines only, "
                                f"not {engine!r}")
        from ..profiles import run_backend

        if engine == "claude-code":
            # the CLI's requests go through relay's endpoint to the profile's Anthropic upstream (engine_endpoint.py):
            # the same checks (grant, URL, secrets-file key) before the run starts
            run_backend(broker, origin, params.profile, "anthropic")
        else:
            backend, _ = run_backend(broker, origin, params.profile, params.backend)
    elif engine == "relay" and backend not in runs.backends:
        declared = backend_spec(backend)  # the registry's one-line hint for a known, unconfigured backend
        raise ConfigRefusal(declared.missing_code if declared else Code.NO_BACKEND,
                            declared.missing_hint if declared else f"no backend named {backend!r}")
    ctx = RunContext(origin=origin, client_id=caller.client_id, conversation=key,
                     user=caller.user, caller_kind=caller.kind.value)
    run_id = await runs.start(ctx, RunParams(
        prompt=params.prompt, model=params.model or broker.config.default_model, backend=backend,
        attachments=[a.model_dump() for a in params.attachments], mode=PermissionMode(params.mode),
        max_tokens=params.max_tokens, tools=params.tools, engine=engine, profile=params.profile,
        cell_id=params.cell_id))
    return RunStartResult(run_id=run_id)


@rpc.method(Method.RUN_CANCEL, RunCancelParams, RunCancelResult, scope=Scope.ANY,
            doc="Cancel a run: only its originator or a browser session of the server's user (as runs.cancel). "
                "False when it already ended.")
async def run_cancel(req: Request, params: RunCancelParams) -> RunCancelResult:
    return RunCancelResult(cancelled=ACCESS.cancel(req, params.run_id))


@rpc.method(Method.RUNS_LIST, RunsListParams, RunsListResult, scope=Scope.ANY,
            doc="Runs from the journal, newest first: a kernel sees its own origin's.")
async def runs_list(req: Request, params: RunsListParams) -> RunsListResult:
    prefix = req.prefix(params.origin_prefix)  # in the store: the limit counts matching runs only
    rows = req.keep(await off_loop(req.broker.store.list_runs, origin=req.origin, limit=params.limit,
                                   origin_prefix=prefix))
    return RunsListResult(runs=rows[:params.limit])  # newest first


@rpc.method(Method.RUNS_GET, RunsGetParams, RunsGetResult, scope=Scope.ANY, doc="One run with its calls.")
async def runs_get(req: Request, params: RunsGetParams) -> RunsGetResult:
    return RunsGetResult(run=await off_loop(ACCESS.run, req, params.run_id))


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
