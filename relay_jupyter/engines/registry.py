"""The one list of run engines: each declares its name, a one-line summary and how the broker builds it.

``run.start``'s ``engine`` (``protocol/run_choices.ENGINE_NAMES``), ``c.RelayApp.default_engine`` and
``%%agent --engine`` take the names from ``run_choices``; this module asserts at import that it declares
exactly those. ``relay`` is built into :class:`~relay_jupyter.runtime.manager.RunManager` (it needs the
manager's backends); every other engine is built here from the :class:`EngineServices` the broker lends it.
Building an engine never imports its SDK: an engine whose optional extra is missing still exists and
refuses its runs in one line (``RunEngine.check``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol.run_choices import ENGINE_NAMES
from ..runtime.engine import RunEngine

__all__ = ["ENGINES", "EngineServices", "EngineSpec", "build_engines"]


@dataclass
class EngineServices:
    """What the broker lends an engine besides the per-run :class:`~relay_jupyter.runtime.engine.EngineRun`."""

    workspace_for: Callable[[str], Path] | None = None
    """conversation key -> its scratch workspace directory (created on first use); None without one."""
    model_endpoint: Any = None
    """``broker/engine_endpoint.EngineEndpoint``: relay's Anthropic endpoint on loopback, a per-run key."""
    jupyter_root: Path | None = None
    protected: Any = None
    """``core.protected.ProtectedPaths`` of the Jupyter root (credential and role refusals)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """``c.RelayApp.extra["engines"][<name>]``: engine settings passed through untouched."""
    read_roots: Any = None
    """``core.protected.ReadRoots`` (``c.RelayApp.read_roots``): where a read outside the workspace needs no card."""
    mcp_gateway: Any = None
    """``broker/runtime_setup.EngineMcp``: a per-run session of relay's gated MCP gateway, or None."""
    state_dir: Path | None = None
    """A private directory of this engine under the relay data dir (kept across runs and restarts), or None
    (an in-memory broker)."""


@dataclass(frozen=True)
class EngineSpec:
    name: str
    summary: str
    build: Callable[[EngineServices], RunEngine] | None
    """None: built into the RunManager."""


def _claude_code(services: EngineServices) -> RunEngine:
    from .claude_code import ClaudeCodeEngine

    return ClaudeCodeEngine(services)


ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec("relay", "relay's own loop over a model backend (anthropic, openai, demo)", None),
    EngineSpec("claude-code", "Claude Code (claude-agent-sdk), every tool call through relay's gate", _claude_code),
)

assert tuple(s.name for s in ENGINES) == ENGINE_NAMES, (tuple(s.name for s in ENGINES), ENGINE_NAMES)


def build_engines(services: EngineServices) -> dict[str, RunEngine]:
    """Every engine besides ``relay``, built over ``services``."""
    return {s.name: s.build(services) for s in ENGINES if s.build is not None}
