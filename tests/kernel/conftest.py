"""Real kernels (jupyter_client) wired to a scripted broker on 127.0.0.1."""

from __future__ import annotations

import html
import os
import queue
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

from .fake_broker import FakeBroker


def start_kernel(env: dict[str, str], tmp: str) -> tuple[KernelManager, Any]:
    """A fresh ipykernel with ``env`` (plus private Jupyter dirs), its client ready."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "CI"))}
    full.update({"JUPYTER_RUNTIME_DIR": f"{tmp}/runtime", "JUPYTER_DATA_DIR": f"{tmp}/data",
                 "IPYTHONDIR": f"{tmp}/ipython", "PYDEVD_DISABLE_FILE_VALIDATION": "1"})
    full.update(env)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=full, cwd=tmp)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def execute(kc: Any, code: str, *, allow_stdin: bool = True, timeout: float = 30.0, cell_id: str | None = None,
            on_iopub: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``code`` as a frontend would (``cellId`` in the metadata, like JupyterLab); return
    (execute_reply content, iopub messages of this request)."""
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
               "allow_stdin": allow_stdin, "stop_on_error": False}
    msg = kc.session.msg("execute_request", content, metadata={"cellId": cell_id} if cell_id else {})
    kc.shell_channel.send(msg)
    msg_id = msg["header"]["msg_id"]
    msgs: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    idle = False
    while not idle:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"cell did not finish: {code[:80]!r}")
        try:
            msg = kc.get_iopub_msg(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            if on_iopub:
                on_iopub(msg)
            continue
        msgs.append(msg)
        if on_iopub:
            on_iopub(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    reply = kc.get_shell_msg(timeout=10)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=10)
    return reply["content"], msgs


def text_of(msgs: list[dict[str, Any]]) -> str:
    """Everything a person would read in the cell output (markdown, plain, streams, errors)."""
    parts = []
    for m in msgs:
        c = m["content"]
        if m["msg_type"] == "stream":
            parts.append(c["text"])
        elif m["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            data = c["data"]
            # a live update carries only escaped text/html; every final output has a text/plain fallback
            parts.append(data.get("text/plain") or html.unescape(re.sub(r"<[^>]*>", "", data.get("text/html", ""))))
        elif m["msg_type"] == "error":
            parts.append("\n".join(c["traceback"]))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        yield fake


@pytest.fixture(scope="module")
def kernel(broker: FakeBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    km, kc = start_kernel(broker.env(), str(tmp_path_factory.mktemp("kernel")))
    reply, _ = execute(kc, "%load_ext relay_jupyter")
    assert reply["status"] == "ok"
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
