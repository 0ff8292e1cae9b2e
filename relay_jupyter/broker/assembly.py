"""Wire the broker's optional parts: the scratch workspace, the agent runtime with its backends,
and the MCP registry. One function each way, used by the Jupyter extension and the daemon alike.

Backends come only from the server's configuration (keys from the config, the 0600 secrets file or
the server's environment). When none is configured, the ``demo`` backend is installed and made the
default — it is never installed next to a real backend, and every text it produces says it is a
demo and how to configure a real one.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends.demo import DEMO_MODEL, DemoBackend
from ..core.protected import ProtectedPaths
from ..storage.checkpoints import CheckpointJournal
from ..storage.paths import config_dir, data_dir, runtime_dir
from ..workspace.scratch import WorkspaceManager
from ..workspace.tools import WorkspaceTools
from .runs import backends_from_config, install_runtime

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["install_components", "start_components", "stop_components"]

log = logging.getLogger("relay_jupyter.broker")


def install_components(broker: Broker, *, jupyter_root: Path, backends: dict[str, Any] | None = None,
                       config_dirs: list[Path] | None = None) -> None:
    """Install workspace tools, checkpoints, the runtime (recovering interrupted runs) and the MCP
    registry (not yet started: see :func:`start_components`)."""
    root = Path(jupyter_root).resolve()
    relay_dir = Path(broker.config.data_dir) if broker.config.data_dir else data_dir()
    if not broker.config.in_memory:
        # checkpoints carry the broker's lease: reconcile settles only those of dead brokers
        broker.checkpoints = CheckpointJournal(relay_dir / "relay.db", owner=getattr(broker.store, "owner_id", None))
        manager = WorkspaceManager(relay_dir / "workspaces")
        protected = ProtectedPaths.for_jupyter(
            root, data_dir=relay_dir, config_dirs=config_dirs or [config_dir()], runtime_dir=runtime_dir())
        broker.workspace_tools = WorkspaceTools(manager, root, broker.checkpoints, protected)
        for problem in broker.workspace_tools.reconcile():
            log.warning("checkpoint reconciled after a crash: %s", problem)
    if backends is None:
        backends = backends_from_config(broker.config)
    if not backends:
        backends = {"demo": DemoBackend()}
        broker.config = broker.config.model_copy(update={"default_backend": "demo", "default_model": DEMO_MODEL})
        log.warning("relay: no model backend is configured; using the demo backend (scripted, says so in every "
                    "answer). Set ANTHROPIC_API_KEY for the server or c.RelayApp.openai_base_url.")
    elif broker.config.default_backend not in backends:
        first = next(iter(backends))
        log.info("relay: default backend %r is not configured; using %r", broker.config.default_backend, first)
        broker.config = broker.config.model_copy(update={"default_backend": first})
    install_runtime(broker, backends)
    broker.mcp = _mcp_registry(broker)


def _mcp_registry(broker: Broker) -> Any:
    from ..mcp.config import load_config
    from ..mcp.registry import McpRegistry

    config = load_config(broker.config.mcp_config_path)
    for name, problem in config.problems.items():
        log.warning("mcp.json%s: %s", f" server {name!r}" if name else "", problem)
    pins = broker.store if hasattr(broker.store, "put_pin") else None
    return McpRegistry(config, pins)


async def start_components(broker: Broker) -> None:
    """Start the broker's lease and storage check, connect the MCP servers (failures are recorded
    per server, never raised)."""
    broker.start_maintenance()
    if broker.mcp is not None:
        await broker.mcp.start()


async def stop_components(broker: Broker) -> None:
    """Cancel runs and stop MCP server processes."""
    if broker.runs is not None:
        try:
            await asyncio.wait_for(broker.runs.aclose(), timeout=10)
        except (TimeoutError, asyncio.TimeoutError):
            log.warning("relay: runs did not stop within 10 s")
    if broker.mcp is not None:
        await broker.mcp.stop()
