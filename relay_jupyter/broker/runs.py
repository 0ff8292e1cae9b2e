"""Older import path of the runtime wiring: :func:`install_runtime` and :func:`backends_from_config` live in
``broker/runtime_setup.py`` (the tool sources: ``broker/tool_sources.py``). No RPC method is registered here:
``run.start`` and ``run.cancel`` are in ``broker/methods/runs.py``, ``conversations.*`` in
``broker/methods/conversations.py``.
"""

from __future__ import annotations

from .conversation_keys import conversation_key
from .runtime_setup import backends_from_config, install_runtime

__all__ = ["install_runtime", "backends_from_config", "conversation_key"]
