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


@pytest.mark.slow
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


# -- the bounds, against the scripted broker on 127.0.0.1 (tests/kernel/fake_broker.py, real HTTP and SSE) ---

def _close_streams(fake: Any) -> None:
    """The broker ends every open event stream (the fake's own shutdown signal, on its loop)."""
    assert fake.loop is not None
    for queue in list(fake.subscribers):
        fake.loop.call_soon_threadsafe(queue.put_nowait, None)


async def _open_pump(fake: Any) -> Any:
    from relay_jupyter.kernel.client import Endpoint, RelayClient
    from relay_jupyter.kernel.session import EventPump

    from .fake_broker import CREDENTIAL

    pump = EventPump(RelayClient(Endpoint(fake.url, f"RelayKernel {CREDENTIAL}", "t")))
    await pump.start(timeout=10)
    await _until(lambda: len(fake.subscribers) == 1, "the pump's stream never opened")
    return pump


@pytest.mark.asyncio
async def test_an_idle_pump_stops_on_a_refused_credential_after_one_try() -> None:
    from .fake_broker import FakeBroker

    with FakeBroker() as fake:
        pump = await _open_pump(fake)
        tries: list[str | None] = []

        def refuse(header: str | None) -> bool:  # a rotated kernel key: every later request is 401
            tries.append(header)
            return False

        fake.authorized = refuse  # type: ignore[method-assign]
        _close_streams(fake)
        await _until(lambda: pump.task.done(), "the idle pump kept trying a refused credential")
        assert len(tries) == 1 and pump.failure is not None and pump.failure.code == "UNAUTHORIZED"
        assert pump.reconnects == 0 and fake.subscribers == []


@pytest.mark.asyncio
async def test_an_idle_pump_with_the_broker_failing_gives_up_after_its_tries_and_a_cell_opens_it_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import relay_jupyter.kernel.session as session

    from .fake_broker import FakeBroker

    monkeypatch.setattr(session, "_IDLE_TRIES", 3)  # the bound itself, smaller (40 tries take ~17 min)
    with FakeBroker() as fake:
        pump = await _open_pump(fake)
        tries = 0
        real = fake.authorized

        def failing(header: str | None) -> bool:  # the broker answers every retry HTTP 500 (it may recover)
            nonlocal tries
            tries += 1
            raise RuntimeError("broker failing")

        fake.authorized = failing  # type: ignore[method-assign]
        _close_streams(fake)
        await _until(lambda: pump.task.done(), "the idle pump never gave up on a broker that keeps failing")
        assert tries == 3 and pump.reconnects == 0  # bounded: 3 tries, each after its backoff (no busy loop)
        assert pump.failure is not None and "HTTP 500" in pump.failure.message
        # the next cell's start() opens it again at once
        fake.authorized = real  # type: ignore[method-assign]
        await pump.start(timeout=10)
        await _until(lambda: len(fake.subscribers) == 1, "the cell's start() did not open the stream again")
        pump.task.cancel()


@pytest.mark.asyncio
async def test_a_pump_whose_first_connect_fails_says_why_at_once() -> None:
    """Only a stream that was open is retried while idle: a cell whose first connect fails gets the reason."""
    from relay_jupyter.kernel.errors import AgentError

    from .fake_broker import FakeBroker

    with FakeBroker() as fake:
        fake.authorized = lambda header: (_ for _ in ()).throw(RuntimeError("down"))  # type: ignore[method-assign]
        from relay_jupyter.kernel.client import Endpoint, RelayClient
        from relay_jupyter.kernel.session import EventPump

        pump = EventPump(RelayClient(Endpoint(fake.url, "RelayKernel x", "t")))
        with pytest.raises(AgentError, match="HTTP 500"):
            await pump.start(timeout=30)
        assert pump.task is not None and pump.task.done()
