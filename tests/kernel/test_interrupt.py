"""Interrupting the kernel while a run streams cancels the run on the broker."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from .conftest import execute, start_kernel
from .fake_broker import FakeBroker


@pytest.mark.slow
def test_interrupt_cancels_the_run(tmp_path: Path) -> None:
    with FakeBroker() as fake:
        km, kc = start_kernel(fake.env(), str(tmp_path))
        try:
            execute(kc, "%load_ext relay_jupyter")
            fake.script([("text", "starting"), ("sleep", 30), ("text", "never")])

            def interrupt_once_running() -> None:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not any(e["type"] == "run.text_delta" for e in fake.events):
                    time.sleep(0.05)  # waiting for the broker thread to stream the first delta
                time.sleep(0.3)
                km.interrupt_kernel()

            threading.Thread(target=interrupt_once_running, daemon=True).start()
            reply, msgs = execute(kc, "%%agent\nslow", timeout=30)
            assert reply["status"] == "error"
            (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
            assert len(tb) == 1 and "interrupted" in tb[0], tb
            assert any(m == "run.cancel" for m, _ in fake.calls)
            # the kernel is usable afterwards
            fake.script([("text", "fine")])
            assert execute(kc, "%%agent\nagain")[0]["status"] == "ok"
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_an_interrupt_ends_the_waiting_card(tmp_path: Path) -> None:
    """Issue 13: after an interrupt the card of the request the cell was waiting on says it was cancelled,
    instead of "waiting for your answer…" forever."""
    with FakeBroker() as fake:
        km, kc = start_kernel(fake.env(), str(tmp_path))
        try:
            execute(kc, "%load_ext relay_jupyter\n%config AgentMagics.consent_ui = 'widget'")
            fake.script([("permission", {"tool": "write_file", "arguments": {"path": "x"}}), ("text", "never")])

            def interrupt_once_asked() -> None:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not any(e["type"] == "permission.request"
                                                              for e in fake.events):
                    time.sleep(0.05)  # waiting for the broker thread to send the request
                time.sleep(0.5)
                km.interrupt_kernel()

            threading.Thread(target=interrupt_once_asked, daemon=True).start()
            reply, msgs = execute(kc, "%%agent\nwrite", timeout=30)
            assert reply["status"] == "error"
            shown = [m for m in msgs if m["msg_type"] in ("display_data", "update_display_data")]
            texts = [m["content"]["data"].get("text/plain", "") for m in shown]
            cards = [t for t in texts if "write_file" in t]
            assert cards and "waiting for your answer" in cards[0], texts
            assert "Cancelled by the interrupt" in cards[-1], cards[-1]
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
