"""``run.start``. The runtime is wired into a :class:`Broker` by
:func:`~relay_jupyter.broker.runtime_setup.install_runtime` (re-exported here for older imports).

``run.start``: a kernel or daemon client runs for its own origin; a browser session names one. The
caller becomes the run's originator: only it answers the run's permission requests and cancels the run
(``run.cancel`` and ``conversations.*`` live in ``broker/methods/runs.py`` and ``broker/methods/conversations.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..backends.registry import spec as backend_spec
from ..core.caller import Caller
from ..core.errors import Code, ConfigRefusal, RoutingRefusal
from ..core.types import PermissionMode
from ..protocol.models_runs import (
    RunStartParams,
    RunStartResult,
)
from ..protocol.names import Method
from ..runtime.manager import RunContext, RunManager, RunParams
from .conversation_keys import conversation_key
from .registry import method
from .runtime_setup import backends_from_config, install_runtime
from .tool_sources import BrokerTools

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["install_runtime", "backends_from_config", "BrokerTools", "conversation_key"]


# -- methods ---------------------------------------------------------------------------------------

def _runs(broker: Broker) -> RunManager:
    from .broker import require

    return require(broker.runs, "the agent runtime")


def _target(caller: Caller, requested: str | None) -> str:
    from .broker import target_origin

    return target_origin(caller, requested)


@method(Method.RUN_START, RunStartParams, RunStartResult,
        doc="Start an agent run in a conversation; events carry its progress and exactly one terminal event.")
async def run_start(broker: Broker, caller: Caller, params: RunStartParams) -> RunStartResult:
    runs = _runs(broker)
    origin = _target(caller, params.origin)
    key = conversation_key(origin, params.conversation)
    # the owner check without loading the history: the run loads it once, when it starts (issue 18)
    existing = runs.conversations.conversation_origin(key)
    if existing is not None and existing != origin:
        # a conversation id of another notebook: same answer as a busy one would leak it, so refuse plainly
        raise RoutingRefusal(Code.NOT_FOUND, f"no conversation {params.conversation} for this notebook")
    backend = params.backend or broker.config.default_backend
    engine = params.engine or broker.config.default_engine
    if engine == "relay" and backend not in runs.backends:
        declared = backend_spec(backend)  # the registry's one-line hint for a known, unconfigured backend
        raise ConfigRefusal(declared.missing_code if declared else Code.NO_BACKEND,
                            declared.missing_hint if declared else f"no backend named {backend!r}")
    ctx = RunContext(origin=origin, client_id=caller.client_id, conversation=key,
                     user=caller.user, caller_kind=caller.kind.value)
    run_id = await runs.start(ctx, RunParams(
        prompt=params.prompt, model=params.model or broker.config.default_model, backend=backend,
        attachments=[a.model_dump() for a in params.attachments], mode=PermissionMode(params.mode),
        max_tokens=params.max_tokens, tools=params.tools, engine=engine))
    return RunStartResult(run_id=run_id)
