"""Older import path of the runtime wiring: :func:`install_runtime` and :func:`backends_from_config` live in
``broker/runtime_setup.py``, :class:`BrokerTools` in ``broker/tool_sources.py``. No RPC method is registered here:
``run.start`` and ``run.cancel`` are in ``broker/methods/runs.py``, ``conversations.*`` in
``broker/methods/conversations.py``.
"""

from __future__ import annotations

from .conversation_keys import conversation_key
from .runtime_setup import backends_from_config, install_runtime
from .tool_sources import BrokerTools

__all__ = ["install_runtime", "backends_from_config", "BrokerTools", "conversation_key"]
