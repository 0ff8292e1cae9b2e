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
from ..core.protected import ProtectedPaths, ReadRoots
from ..storage.paths import data_dir
from .conversation_keys import migrate_legacy_keys
from ..workspace.scratch import WorkspaceManager
from ..workspace.tools import WorkspaceTools
from .runtime_setup import backends_from_config, install_runtime

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["install_components", "start_components", "stop_components"]

log = logging.getLogger("relay_jupyter.broker")


def jupyter_dirs() -> dict[str, list[Path]]:
    """Every Jupyter config, data and runtime dir this server uses (what ``jupyter --paths`` lists:
    ``JUPYTER_CONFIG_DIR``/``JUPYTER_CONFIG_PATH``, the user, sys-prefix and system dirs)."""
    from jupyter_core.paths import (
        jupyter_config_dir,
        jupyter_config_path,
        jupyter_data_dir,
        jupyter_path,
        jupyter_runtime_dir,
    )

    def paths(found: list[str]) -> list[Path]:
        # an empty entry (a stray ':' in JUPYTER_CONFIG_PATH / JUPYTER_PATH) would stand for the current
        # directory, often the Jupyter root itself, and refuse every push: dropped, with a warning
        empty = [p for p in found if not p]
        if empty:
            log.warning("relay: ignoring %d empty entr%s in the Jupyter paths (JUPYTER_CONFIG_PATH / JUPYTER_PATH)",
                        len(empty), "y" if len(empty) == 1 else "ies")
        return [Path(p) for p in dict.fromkeys(found) if p]

    return {"config": paths([jupyter_config_dir(), *jupyter_config_path()]),
            "data": paths([jupyter_data_dir(), *jupyter_path()]),
            "runtime": [Path(jupyter_runtime_dir())]}


def protected_paths(broker: Broker, root: Path, relay_dir: Path, config_dirs: list[Path] | None = None
                    ) -> ProtectedPaths:
    """The refusal rules of the Jupyter root: by role (relay data dir, every Jupyter dir, the MCP
    config and secrets file wherever they are), by name, and the credential stores."""
    from ..mcp.config import default_config_path

    dirs = jupyter_dirs()
    cfg = broker.config
    return ProtectedPaths.for_jupyter(
        root, data_dir=relay_dir, config_dirs=[*(config_dirs or []), *dirs["config"]], data_dirs=dirs["data"],
        runtime_dir=dirs["runtime"][0], mcp_config=Path(cfg.mcp_config_path or default_config_path()),
        secrets_file=Path(cfg.secrets_file) if cfg.secrets_file else None, secret_globs=cfg.secret_globs)


def install_components(broker: Broker, *, jupyter_root: Path, backends: dict[str, Any] | None = None,
                       config_dirs: list[Path] | None = None, user_umask: int | None = None) -> None:
    """Install workspace tools, checkpoints, the runtime (recovering interrupted runs) and the MCP
    registry (not yet started: see :func:`start_components`).

    ``user_umask`` is the umask the user started the server with (the daemon sets 077 for itself
    and passes the previous value); None reads this process's own. New files a push creates get
    ``0o666 & ~user_umask``."""
    root = Path(jupyter_root).resolve()
    relay_dir = Path(broker.config.data_dir) if broker.config.data_dir else data_dir()
    if not broker.config.in_memory:
        # the store's own checkpoint journal: on its one connection (SQLite) or in the shared database
        # (PostgreSQL); checkpoints carry the broker's lease: reconcile settles only those of dead brokers
        broker.checkpoints = broker.store.checkpoints
        manager = WorkspaceManager(relay_dir / "workspaces")
        protected = protected_paths(broker, root, relay_dir, config_dirs)
        broker.workspace_tools = WorkspaceTools(manager, root, broker.checkpoints, protected,
                                                read_roots=ReadRoots(broker.config.read_roots), umask=user_umask)
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
    # after the runtime's crash repair (which reads runs by the ids they were stored with)
    migrate_legacy_keys(broker.runs.conversations,
                        None if broker.config.in_memory else relay_dir / "workspaces")
    broker.mcp = _mcp_registry(broker)
    from .elicitations import router_of

    router_of(broker)  # MCP servers' questions become cards in the notebook (docs/mcp.md, "Elicitation")


def _mcp_registry(broker: Broker) -> Any:
    from ..mcp.config import load_config

    config = load_config(broker.config.mcp_config_path)
    for name, problem in config.problems.items():
        log.warning("mcp.json%s: %s", f" server {name!r}" if name else "", problem)
    if not config.servers:
        # no MCP server to connect (mcp.json is read once, at start): no registry, so the MCP SDK that the
        # registry imports (about 1.3 s of CPU) is not imported either; every caller takes broker.mcp None as
        # "no MCP tools" (issue 19 "Daemon start": a kernel that starts the daemon waits for it)
        return None
    from ..mcp.registry import McpRegistry

    registry = McpRegistry(config, broker.store)
    # machine-to-machine MCP servers (OAuth client_credentials): the client secret from the secrets file only
    from ..backends.keys import KeySource

    secrets_file = broker.config.secrets_file
    registry.enable_client_credentials(lambda entry: KeySource({}, secrets_file, env={}).get(entry))
    return registry


async def start_components(broker: Broker) -> None:
    """Start the broker's lease and storage check, connect the MCP servers (failures are recorded
    per server, never raised)."""
    broker.metrics.start_loop_probe()  # relay_event_loop_lag_seconds in /metrics (issue 18)
    broker.start_maintenance()
    if broker.mcp is not None:
        await broker.mcp.start()


async def stop_components(broker: Broker) -> None:
    """Cancel runs and stop MCP server processes."""
    broker.metrics.stop_loop_probe()
    if broker.runs is not None:
        try:
            await asyncio.wait_for(broker.runs.aclose(), timeout=10)
        except (TimeoutError, asyncio.TimeoutError):
            log.warning("relay: runs did not stop within 10 s")
    if broker.mcp is not None:
        await broker.mcp.stop()
    endpoint = getattr(broker, "engine_endpoint", None)  # relay's Anthropic endpoint for engine subprocesses
    if endpoint is not None:
        await endpoint.aclose()
