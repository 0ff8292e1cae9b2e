"""The ``%load_ext`` pre-warm: it connects an already running broker in the background, never starts a
daemon, never shows anything, and a pre-warm that failed leaves the first cell to do (and report) the work."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.kernel.client import RelayClient
from relay_jupyter.kernel.prewarm import prewarm, schedule_prewarm
from relay_jupyter.kernel.session import Session

from .conftest import execute, start_kernel, text_of
from .fake_broker import CREDENTIAL, FakeBroker

OUTPUTS = {"stream", "display_data", "update_display_data", "execute_result", "error", "clear_output"}
SESSION = "get_ipython().magics_manager.registry['AgentMagics'].session"
# waits for the pre-warm task (it never raises) and prints what it left behind
PREWARM_STATE = (f"import asyncio\n_s = {SESSION}\n"
                 "if _s.prewarm_task is not None:\n    await asyncio.wait({_s.prewarm_task})\n"
                 "print('client', _s.client is not None, 'stream', bool(_s.pump and _s.pump.connected.is_set()),"
                 " 'grant', _s.connected_origin, 'error', _s.prewarm_error)")


def outputs(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in msgs if m["msg_type"] in OUTPUTS]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # a Unix socket path must stay under ~104 bytes; pytest's tmp_path can be longer
    path = Path(tempfile.mkdtemp(prefix="rp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _kernel(env: dict[str, str], tmp: Path) -> tuple[Any, Any]:
    return start_kernel(env, str(tmp))


def test_prewarm_connects_before_the_first_cell_and_shows_nothing(tmp_path: Path) -> None:
    with FakeBroker() as fake:
        km, kc = _kernel(fake.env(), tmp_path)
        try:
            reply, msgs = execute(kc, "%load_ext relay_jupyter")
            assert reply["status"] == "ok" and outputs(msgs) == []
            reply, msgs = execute(kc, PREWARM_STATE)
            assert "client True stream True grant True error None" in text_of(msgs), text_of(msgs)
            # before any %%agent cell: the grant was checked and the event stream is open
            assert [m for m, _ in fake.calls] == ["grants.get"] and len(fake.subscribers) == 1
            fake.script([("text", "warm hello")])
            reply, msgs = execute(kc, "%%agent\nhi", allow_stdin=False)
            assert reply["status"] == "ok" and "warm hello" in text_of(msgs)
            # the first cell used what the pre-warm made: no second grants.get, no second stream
            assert [m for m, _ in fake.calls] == ["grants.get", "run.start"] and len(fake.subscribers) == 1
            # the first cell's cost was mostly pydantic (0.08-0.25 s), pulled in by the SSE parser's module
            reply, msgs = execute(kc, "import sys\nprint(sorted(m for m in ('pydantic', 'ipywidgets', 'anthropic') "
                                      "if m in sys.modules))")
            assert "[]" in text_of(msgs), text_of(msgs)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_first_cell_works_when_the_broker_was_down_at_load(tmp_path: Path, short_dir: Path) -> None:
    sock = short_dir / "b.sock"
    km, kc = _kernel({"RELAY_URL": f"unix://{sock}"}, tmp_path)
    try:
        reply, msgs = execute(kc, "%load_ext relay_jupyter")
        assert reply["status"] == "ok" and outputs(msgs) == []
        reply, msgs = execute(kc, PREWARM_STATE)
        state = text_of(msgs)
        # the failure is kept quietly and nothing half-made is left for the first cell
        assert "client False stream False grant False error BrokerUnreachable" in state, state
        with FakeBroker(unix_path=str(sock)) as fake:
            fake.script([("text", "late broker")])
            reply, msgs = execute(kc, "%%agent\nhi", allow_stdin=False)
            assert reply["status"] == "ok", text_of(msgs)
            assert "late broker" in text_of(msgs)
            assert [m for m, _ in fake.calls] == ["grants.get", "run.start"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_broker_down_at_load_and_at_the_first_cell_fails_in_the_cell(tmp_path: Path, short_dir: Path) -> None:
    km, kc = _kernel({"RELAY_URL": f"unix://{short_dir / 'none.sock'}"}, tmp_path)
    try:
        reply, msgs = execute(kc, "%load_ext relay_jupyter")
        assert reply["status"] == "ok" and outputs(msgs) == []
        reply, msgs = execute(kc, "%%agent\nhi", allow_stdin=False)
        assert reply["status"] == "error"
        (error,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
        assert len(error) == 1 and "unreachable" in error[0]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_load_never_starts_a_daemon(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    km, kc = _kernel({"JUPYTER_RUNTIME_DIR": str(runtime)}, tmp_path)  # no RELAY_URL: the daemon case
    try:
        reply, msgs = execute(kc, "%load_ext relay_jupyter")
        assert reply["status"] == "ok" and outputs(msgs) == []
        reply, msgs = execute(kc, PREWARM_STATE)
        assert "client False stream False grant False error BrokerUnreachable" in text_of(msgs), text_of(msgs)
        # no socket, no 0700 directory, no daemon log: nothing was spawned
        assert not (runtime / "relay").exists()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_load_does_not_wait_for_a_broker_that_never_answers(tmp_path: Path) -> None:
    """A broker that accepts and stays silent: %load_ext returns, the kernel keeps running cells, and the
    pre-warm's connections were made in the background."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    accepted = threading.Event()

    def hold() -> None:
        while len(held) < 2:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
        accepted.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    km, kc = _kernel({"RELAY_URL": f"http://127.0.0.1:{port}/relay/", "RELAY_KERNEL_CREDENTIAL": CREDENTIAL},
                     tmp_path)
    try:
        reply, msgs = execute(kc, "%load_ext relay_jupyter", timeout=20)
        assert reply["status"] == "ok" and outputs(msgs) == []
        assert accepted.wait(20), "the pre-warm never connected"
        reply, msgs = execute(kc, "print(6 * 7)", timeout=20)
        assert reply["status"] == "ok" and "42" in text_of(msgs)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        listener.close()
        for conn in held:
            conn.close()


class _SlowGrantBroker(FakeBroker):
    """``grants.get`` answers only when the test releases it (to race a revoke against it)."""

    def __init__(self) -> None:
        super().__init__()
        self.release: asyncio.Event | None = None

    async def handle(self, method: str, params: dict[str, Any]) -> Any:
        if method == "grants.get":
            self.release = asyncio.Event()
            await self.release.wait()
        return await super().handle(method, params)


async def _until(predicate: Any) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.01)  # watching another thread's state: no event to await


@pytest.mark.asyncio
@pytest.mark.parametrize("revoke", [False, True])
async def test_a_grant_change_during_prewarm_wins(revoke: bool) -> None:
    with _SlowGrantBroker() as fake:
        os.environ.pop("JPY_SESSION_NAME", None)
        session = Session(None)
        session.adopt(RelayClient(_endpoint(fake)))
        task = asyncio.ensure_future(prewarm(session))
        await _until(lambda: fake.release is not None)
        if revoke:
            session.connected_origin = False  # what relay.grants() Revoke does while the answer is in flight
        assert fake.loop is not None and fake.release is not None
        fake.loop.call_soon_threadsafe(fake.release.set)
        await task
        assert session.connected_origin is (not revoke)
        assert session.pump is not None and session.pump.connected.is_set()
        session.drop_client()


def _endpoint(fake: FakeBroker) -> Any:
    from relay_jupyter.kernel.client import Endpoint

    return Endpoint(fake.url, f"RelayKernel {CREDENTIAL}", "kernel")


def test_schedule_without_a_running_loop_does_nothing() -> None:
    session = Session(None)
    assert schedule_prewarm(session) is None and session.prewarm_task is None
