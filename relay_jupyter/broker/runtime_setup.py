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
from ..core.caller import Caller
from ..core.errors import Refusal
from ..runtime.manager import RunManager, RuntimeConfig
from ..runtime.tools import ToolContext
from .conversation_keys import conversation_key
from .tool_sources import BrokerTools

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["backends_from_config", "install_runtime"]


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


def install_runtime(broker: Broker, backends: Mapping[str, Backend] | None = None,
                    config: RuntimeConfig | None = None, *, recover: bool = True) -> RunManager:
    """Build the run manager over the broker's gate, store, events and consent router; set
    ``broker.runs`` and ``broker.client_tools``; repair runs a previous process left unfinished."""
    store = broker.store
    if backends is None:
        backends = backends_from_config(broker.config)
    runtime_config = config or RuntimeConfig(**{
        "turn_timeout": broker.config.turn_timeout, "turn_idle_timeout": broker.config.turn_idle_timeout,
        **{k: v for k, v in broker.config.extra.get("runtime", {}).items() if k in RuntimeConfig.__dataclass_fields__}})
    manager = RunManager(broker.gate, store, store, broker.events, [BrokerTools(broker)], backends,
                         runtime_config, consent=broker.permissions)
    broker.runs = manager

    async def client_tools(caller: Caller, origin: str, conversation: str, tool: str,
                           arguments: Any) -> dict[str, Any]:
        ctx = ToolContext(origin=origin, conversation=conversation_key(origin, conversation),
                          originator=caller.client_id,
                          caller_kind=caller.kind.value, user=caller.user)
        result = await manager.execute_client_call(ctx, tool, arguments)
        if result.code is not None:  # refused before it ran: a clear RPC error for a direct call
            raise Refusal(result.code, result.content)
        return {"content": result.content, "is_error": result.is_error}

    broker.client_tools = client_tools
    if recover:
        manager.recover()
    return manager
