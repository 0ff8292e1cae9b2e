"""``%load_ext relay_jupyter``: register the magics, the input transformer and ``relay``.

Loading is cheap (no ipywidgets, pandas or LLM SDK import here): they are imported when a cell
first needs them. Loading also schedules the pre-warm (``prewarm.py``): finding an already running
broker, ``grants.get`` and opening the event stream in the background, so the first cell finds them ready.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def _on_pre_run_cell(magics: Any) -> Any:
    def hook(info: Any) -> None:
        # the frontend's cell id (nbformat >= 4.5) identifies an earlier %%agent cell that is re-run
        magics.current_cell_id = getattr(info, "cell_id", None)

    return hook


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%agent`` / ``%agent``, the ``await`` rewrite and the ``relay`` helper object."""
    from .api import Relay
    from .magics import AgentMagics
    from .prewarm import schedule_prewarm
    from .transformer import agent_transformer

    if getattr(ipython, "_relay_loaded", False):
        return
    magics = AgentMagics(ipython)
    ipython.register_magics(magics)
    ipython.input_transformers_cleanup.append(agent_transformer)
    hook = _on_pre_run_cell(magics)
    ipython.events.register("pre_run_cell", hook)
    relay = Relay(magics.session)
    ipython.push({"relay": relay}, interactive=True)
    ipython._relay_loaded = True
    ipython._relay_hook = hook
    if magics.prewarm:
        # only scheduled: it runs on the kernel's loop after this cell, so %load_ext is not slower
        schedule_prewarm(magics.session)


def unload_ipython_extension(ipython: Any) -> None:
    """Undo :func:`load_ipython_extension` (the magics stay registered, as IPython has no unregister)."""
    from .transformer import agent_transformer

    if agent_transformer in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(agent_transformer)
    hook = getattr(ipython, "_relay_hook", None)
    if hook is not None:
        try:
            ipython.events.unregister("pre_run_cell", hook)
        except ValueError:
            pass
    ipython.user_ns.pop("relay", None)
    magics = ipython.magics_manager.registry.get("AgentMagics")
    task = getattr(getattr(magics, "session", None), "prewarm_task", None)
    if task is not None and not task.done():
        task.cancel()
    ipython._relay_loaded = False
