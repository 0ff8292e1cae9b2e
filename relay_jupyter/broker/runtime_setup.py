"""Wiring the agent runtime into a :class:`Broker`: the backends the configuration enables
(:func:`backends_from_config`, over ``backends/registry.py``) and :func:`install_runtime`, which builds
the :class:`~relay_jupyter.runtime.manager.RunManager` over the broker's gate, store, events and consent
router. Moved out of ``broker/runs.py`` (which keeps only RPC handlers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..backends.base import Backend
from ..backends.keys import KeySource
from ..backends.registry import build_backends
from ..engines.registry import ENGINES, EngineServices
from ..runtime.engine import RunEngine
from ..runtime.manager import RunManager, RuntimeConfig
from .tool_sources import ToolSources

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["backends_from_config", "engine_services", "install_runtime"]


def backends_from_config(config: Any, keys: KeySource | None = None) -> dict[str, Backend]:
    """The backends the server's configuration makes available (registry order). Keys come from the
    config, the 0600 secrets file or the server's environment — never from a kernel. Every model URL
    follows the endpoint policy (``mcp/policy``: https, loopback http, or ``allow_insecure_endpoints``)."""
    from ..mcp.policy import check_model_endpoint, parse_insecure_endpoints

    keys = keys or KeySource(
        {"anthropic": config.anthropic_api_key.get_secret_value() if config.anthropic_api_key else "",
         "openai": config.openai_api_key.get_secret_value() if config.openai_api_key else ""},
        config.secrets_file)
    insecure = parse_insecure_endpoints(getattr(config, "allow_insecure_endpoints", ()))

    def check(url: str, setting: str) -> str:
        return check_model_endpoint(url, setting, allow_insecure=insecure)

    return build_backends(config, keys, check)


def engine_services(broker: Broker, name: str) -> EngineServices:
    """What the broker lends an engine (``engines/registry.py``): the scratch workspace of a conversation,
    relay's Anthropic endpoint on loopback with per-run keys, the Jupyter root's refusal rules."""
    from .engine_endpoint import EngineEndpoint

    ws = broker.workspace_tools
    endpoint = getattr(broker, "engine_endpoint", None)
    if endpoint is None:
        endpoint = EngineEndpoint(broker)
        broker.engine_endpoint = endpoint  # type: ignore[attr-defined]
    return EngineServices(
        workspace_for=(lambda key: ws.manager.for_conversation(key).root) if ws is not None else None,
        model_endpoint=endpoint, jupyter_root=ws.protected.root if ws is not None else None,
        protected=ws.protected if ws is not None else None,
        options=dict((broker.config.extra.get("engines") or {}).get(name) or {}),
        read_roots=ws.read_roots if ws is not None else None,
        state_dir=_engine_state_dir(broker, name), mcp_gateway=EngineMcp(broker))


class EngineMcp:
    """relay's gated MCP gateway (``broker/mcp_gateway.py``, docs/mcp.md) as an engine sees it — engines import
    no broker code: a session (URL + bearer token) for one run, bound to its origin, originator, conversation
    and mode, revoked with :meth:`end` when the run ends."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def session(self, *, origin: str, originator: str, run_id: str, conversation_key: str, mode: Any,
                      label: str, caller_kind: str | None = None, allowed: Any = None) -> Any:
        """A gateway session for the run (its loopback listener starts on first use). ``caller_kind``: the kind
        of the run's caller (its tool context's), so a run a kernel started is offered that kernel's tools;
        ``allowed``: the run's ``--tools`` (None: every granted tool)."""
        from .conversation_keys import conversation_name
        from .mcp_gateway import mcp_gateway_of

        return await mcp_gateway_of(self.broker).session(
            origin, originator=originator, run_id=run_id, conversation=conversation_name(conversation_key, origin),
            mode=mode, label=label, caller_kind=caller_kind, allowed=allowed)

    @staticmethod
    def expect(session: Any, tool_use_id: Any, tool: str, arguments: Any) -> bool:
        """The model proposed relay's ``tool`` under ``tool_use_id`` (the engine's hook saw it): the gateway's
        call is journalled and audited under that id (``broker/gateway_links.py``)."""
        return bool(session.proposed.expect(tool_use_id, tool, arguments))

    def end(self, session: Any) -> None:
        from .mcp_gateway import mcp_gateway_of

        mcp_gateway_of(self.broker).end(session)


def _engine_state_dir(broker: Broker, name: str) -> Any:
    """``<relay data dir>/engines/<name>`` (created 0700 by the engine on first use); None in memory."""
    if broker.config.in_memory:
        return None
    from pathlib import Path

    from ..storage.paths import data_dir

    return (Path(broker.config.data_dir) if broker.config.data_dir else data_dir()) / "engines" / name


def install_runtime(broker: Broker, backends: Mapping[str, Backend] | None = None,
                    config: RuntimeConfig | None = None, *, recover: bool = True,
                    engines: Mapping[str, RunEngine] | None = None) -> RunManager:
    """Build the run manager over the broker's gate, store, events and consent router; set
    ``broker.runs`` (whose executor also serves ``tools.call``); repair runs a previous process left unfinished.
    ``engines``: the engines besides ``relay`` (default: every one ``engines/registry.py`` declares)."""
    store = broker.store
    if backends is None:
        backends = backends_from_config(broker.config)
    runtime_config = config or RuntimeConfig(**{
        "turn_timeout": broker.config.turn_timeout, "turn_idle_timeout": broker.config.turn_idle_timeout,
        **{k: v for k, v in broker.config.extra.get("runtime", {}).items() if k in RuntimeConfig.__dataclass_fields__}})
    if engines is None:
        engines = {spec.name: spec.build(engine_services(broker, spec.name))
                   for spec in ENGINES if spec.build is not None}
    manager = RunManager(broker.gate, store, store, broker.events, ToolSources(broker), backends,
                         runtime_config, consent=broker.permissions, engines=engines)
    manager.telemetry = broker.telemetry  # a telemetry row per model turn (core/telemetry.py)
    broker.runs = manager

    if recover:
        manager.recover()
    return manager
