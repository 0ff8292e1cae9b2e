"""relay-jupyter: a safe AI agent in Jupyter.

- ``%load_ext relay_jupyter`` registers the ``%%agent`` and ``%agent`` magics (kernel side).
- The Jupyter server extension ``relay_jupyter`` runs the broker: the enforcement boundary
  that holds the keys, gates every tool call, enforces budgets and writes the audit log.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .server.app import RelayApp

    return [{"module": "relay_jupyter.server.app", "app": RelayApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "relay-jupyter"}]


def load_ipython_extension(ipython: Any) -> None:
    from .kernel.extension import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .kernel.extension import unload_ipython_extension as _unload

    _unload(ipython)
