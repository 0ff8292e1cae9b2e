"""Drive a real kernel with jupyter_client and timestamp every iopub message of a cell.

A kernel is launched from any Python (a peer's venv or ours) through a kernelspec written into a
temporary directory, or attached to through a connection file (a kernel the Jupyter server started).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

__all__ = ["OUTPUT_TYPES", "CellRun", "Kernel", "write_kernelspec"]

#: iopub message types that put something in the cell's output area
OUTPUT_TYPES = frozenset({"stream", "display_data", "update_display_data", "execute_result", "error",
                          "clear_output"})


def write_kernelspec(directory: Path, name: str, python: Path) -> None:
    """A kernelspec ``name`` under ``directory`` launching ipykernel with ``python``."""
    spec = directory / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": name, "language": "python"}))


@dataclass
class CellRun:
    """One executed cell: when it was sent, and every iopub message with its arrival time."""

    code: str
    sent: float
    messages: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    idle: float | None = None
    reply: dict[str, Any] | None = None

    @property
    def status(self) -> str:
        return str((self.reply or {}).get("content", {}).get("status", "?"))

    def outputs(self) -> list[tuple[float, dict[str, Any]]]:
        """The output messages (see :data:`OUTPUT_TYPES`)."""
        return [(t, m) for t, m in self.messages if m["header"]["msg_type"] in OUTPUT_TYPES]

    def output_bytes(self) -> int:
        """Bytes of the output messages' content and metadata, as JSON (what a frontend receives,
        less the fixed envelope). With ``RELAY_BENCH_DUMP=<file>`` each message's type, bytes and
        content are appended to that file as JSON lines (to see where the bytes go)."""
        dump = os.environ.get("RELAY_BENCH_DUMP")
        if dump:
            with open(dump, "a", encoding="utf-8") as fh:
                for t, m in self.outputs():
                    fh.write(json.dumps({"t": round(t - self.sent, 3), "type": m["header"]["msg_type"],
                                         "bytes": len(json.dumps(m["content"], ensure_ascii=False).encode())
                                         + len(json.dumps(m.get("metadata") or {}).encode()),
                                         "content": m["content"]}, ensure_ascii=False) + "\n")
        return sum(len(json.dumps(m["content"], ensure_ascii=False).encode())
                   + len(json.dumps(m.get("metadata") or {}).encode()) for _, m in self.outputs())

    def first_containing(self, marker: str) -> float | None:
        """Seconds from sending to the first output message whose content contains ``marker``."""
        for t, m in self.outputs():
            if marker in json.dumps(m["content"], ensure_ascii=False):
                return t - self.sent
        return None

    def elapsed(self) -> float:
        """Seconds from sending to the kernel going idle."""
        assert self.idle is not None
        return self.idle - self.sent

    def error_text(self) -> str:
        """The error or stderr the cell showed, short (to report a variant that failed)."""
        parts = []
        for _, m in self.outputs():
            c = m["content"]
            if m["header"]["msg_type"] == "error":
                parts.append(f"{c.get('ename')}: {c.get('evalue')}")
            elif m["header"]["msg_type"] == "stream" and c.get("name") == "stderr":
                parts.append(c.get("text", ""))
            elif m["header"]["msg_type"] in ("display_data", "execute_result"):
                parts.append(str(c.get("data", {}).get("text/plain", "")))
        return " | ".join(p.strip() for p in parts if p.strip())[-600:]


class Kernel:
    """A kernel and an async client; :meth:`execute` runs one cell and records its iopub traffic."""

    def __init__(self, manager: AsyncKernelManager | None, client: AsyncKernelClient) -> None:
        self.manager = manager
        self.client = client

    @classmethod
    async def launch(cls, spec_dir: Path, name: str, env: dict[str, str], cwd: Path) -> Kernel:
        """Start kernelspec ``name`` from ``spec_dir`` (see :func:`write_kernelspec`)."""
        specs = KernelSpecManager(kernel_dirs=[str(spec_dir / "kernels")])
        manager = AsyncKernelManager(kernel_name=name, kernel_spec_manager=specs)
        # the kernel's own stderr (a TCP warning, log lines) would interleave with the report
        await manager.start_kernel(env=env, cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = manager.client()
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        return cls(manager, client)

    @classmethod
    async def attach(cls, connection_file: Path) -> Kernel:
        """A client of a kernel someone else started (the Jupyter server)."""
        client = AsyncKernelClient()
        client.load_connection_file(str(connection_file))
        # no heartbeat: without a manager, wait_for_ready takes one missed beat (1 s) for a dead kernel,
        # and a kernel still importing on a busy machine misses it; the shell reply is the readiness test
        client.start_channels(hb=False)
        await client.wait_for_ready(timeout=60)
        return cls(None, client)

    async def execute(self, code: str, timeout: float = 120.0) -> CellRun:
        """Run ``code`` as a notebook frontend without stdin would (``allow_stdin=False``), recording
        every iopub message of it with the time it arrived here."""
        # drain what an earlier cell left on iopub (late status messages) so it is not mistaken for ours
        while True:
            try:
                await self.client.get_iopub_msg(timeout=0)
            except queue.Empty:  # nothing left
                break
        sent = time.monotonic()
        msg_id = self.client.execute(code, allow_stdin=False, store_history=True)
        run = CellRun(code, sent)
        async with asyncio.timeout(timeout):
            while run.idle is None:
                msg = await self.client.get_iopub_msg()
                now = time.monotonic()
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                run.messages.append((now, msg))
                if msg["header"]["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                    run.idle = now
            while run.reply is None:
                reply = await self.client.get_shell_msg()
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    run.reply = reply
        return run

    async def close(self) -> None:
        """Stop the channels, and the kernel when this object started it."""
        self.client.stop_channels()
        if self.manager is not None:
            await self.manager.shutdown_kernel(now=False)
