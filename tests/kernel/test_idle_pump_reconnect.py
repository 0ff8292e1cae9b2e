"""An idle kernel's event stream that drops comes back by itself (kernel/session.py ``EventPump``): the broker
sees the notebook's kernel attached again (``EventBus.kernel_clients``, what the MCP gateway's kernel tools of that
notebook need: broker/mcp_gateway.py ``_notebook_kernel``) without any ``%%agent`` cell.

A real Jupyter server (pytest-jupyter) and a real kernel; the broker closes the kernel's stream from its side, as
it does for a slow subscriber (the SSE handler's ``on_overflow`` closes the TCP connection). Nothing mocked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from jupyter_kernels import KernelRig, in_kernel

pytestmark = pytest.mark.slow

ORIGIN = "notebook:idle.ipynb"
PUMP = "get_ipython().magics_manager.registry['AgentMagics'].session.pump"


@pytest.fixture
def jp_server_config(tmp_path):
    return {
        "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}},
        "RelayApp": {"data_dir": str(tmp_path / "relaydata")},
    }


def _kernel_subs(broker: Any) -> set[Any]:
    return {s for s in broker.events._by_origin.get(ORIGIN, ()) if s.caller.kind.name == "KERNEL" and not s.closed}


async def _until(check: Any, what: str, bound: float = 90.0) -> Any:
    """Poll ``check()`` until it is truthy (a bound, not a timed assertion: the test fails only if it never is)."""
    try:
        async with asyncio.timeout(bound):
            while not (found := check()):
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(what) from None
    return found


async def test_an_idle_kernel_whose_stream_the_broker_closed_is_attached_again_without_a_cell(
        jp_fetch, jp_serverapp) -> None:
    broker = jp_serverapp.extension_manager.extension_points["relay_jupyter"].app.broker
    rig = KernelRig(jp_fetch, jp_serverapp)
    kernel = await rig.session("idle.ipynb")
    await in_kernel(jp_serverapp, kernel, "%load_ext relay_jupyter")  # the pre-warm opens the stream
    first = await _until(lambda: _kernel_subs(broker), "idle.ipynb's kernel never attached")
    [client_id] = broker.events.kernel_clients(ORIGIN)
    runs_before = broker.store.events_since(0)

    for drop in range(2):  # twice: the pump's backoff starts over after each stream it opened again
        for sub in first:
            sub.on_overflow()  # the broker closes the connection (what a slow subscriber gets)
        await _until(lambda: not (_kernel_subs(broker) & first), "the closed stream still counted as attached")
        # no cell runs in the kernel meanwhile: the idle pump reconnects by itself (with since=<last id>)
        again = await _until(lambda: _kernel_subs(broker) - first, f"drop {drop}: the idle kernel never came back")
        assert broker.events.kernel_clients(ORIGIN) == {client_id}  # the same kernel, one stream
        first = again

    # no run was started to bring it back (the gateway would have offered nothing until the next %%agent before)
    assert not [e for e in broker.store.events_since(0) if e.type == "run.started"]
    assert len(broker.store.events_since(0)) == len(runs_before)
    assert (await in_kernel(jp_serverapp, kernel, f"print({PUMP}.reconnects)")).strip() == "2"

    # the kernel shut down: its stream goes and nothing comes back (the pump ends with the kernel's process)
    await jp_fetch("api", "kernels", kernel, method="DELETE")
    await _until(lambda: not broker.events.kernel_clients(ORIGIN), "idle.ipynb's kernel still attached after its "
                                                                  "shutdown")
