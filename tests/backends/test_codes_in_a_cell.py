"""What a notebook user sees when the model server misbehaves: a real Jupyter server with the relay
extension, a real kernel running ``%%agent``, and the shipped FaultModelServer as the model. Each fault
fails the cell (status ``error``, so Run All and nbval stop) with one line naming its code and what to
do — never ``INTERNAL``, never a green cell, never a hang (deadlines configured short)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from relay_jupyter.testing import FaultModelServer

from kernel.conftest import execute, text_of
from kernel.real_server import RealServer

pytestmark = pytest.mark.slow
MODEL = "claude-fault-1"
KEY = "sk-test-cell-faults-0123456789"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FaultModelServer, Any]]:
    with FaultModelServer("ok", api_key=KEY, interval=0.05, max_seconds=30) as server:
        tmp = tmp_path_factory.mktemp("cellfaults")
        config = {"anthropic_base_url": server.base_url, "anthropic_api_key": KEY, "default_model": MODEL,
                  "turn_timeout": 3.0, "turn_idle_timeout": 1.0}
        with RealServer(tmp, config) as srv:
            kc = srv.kernel_for("faults.ipynb")
            assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
            connect(kc, server)
            yield server, kc


def connect(kc: Any, server: FaultModelServer) -> None:
    """The first cell shows the connect card; click it as a browser would."""
    clicked: list[str] = []

    def observe(msg: dict[str, Any]) -> None:
        if msg["msg_type"] != "comm_open" or clicked:
            return
        state = msg["content"]["data"].get("state", {})
        if state.get("_model_name") == "ButtonModel" and state.get("description") == "Connect":
            clicked.append(msg["content"]["comm_id"])
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": msg["content"]["comm_id"], "data": {
                "method": "custom", "content": {"event": "click"}}}))

    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nsay hello", on_iopub=observe, timeout=60)
    assert reply["status"] == "ok" and clicked, text_of(msgs)
    assert server.text in text_of(msgs)


@pytest.mark.parametrize(("fault", "code", "words"), [
    ("stall_pings", "BACKEND_TIMEOUT", "sent no content"),
    ("trickle", "BACKEND_TIMEOUT", "took longer than turn_timeout"),
    ("truncate", "BACKEND_ERROR", "closed the stream before the answer ended"),
    ("cut", "BACKEND_UNREACHABLE", "was cut before the answer ended"),
    ("error_event", "BACKEND_ERROR", "failed mid-stream (overloaded_error: Overloaded)"),
    ("malformed_json", "BACKEND_ERROR", "malformed stream event"),
])
def test_each_fault_fails_the_cell_with_one_line(stack, fault, code, words):
    server, kc = stack
    server.fault = fault
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nanswer me", timeout=60)
    assert reply["status"] == "error", text_of(msgs)
    errors = [m["content"] for m in msgs if m["msg_type"] == "error"]
    assert len(errors) == 1
    (line,) = errors[0]["traceback"]  # one line, no Python traceback
    assert f"[{code}]" in line and words in line, line
    assert "INTERNAL" not in line and KEY not in text_of(msgs)
    server.fault = "ok"
