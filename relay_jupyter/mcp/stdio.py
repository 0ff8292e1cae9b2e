"""A bounded stdio transport for MCP servers.

Why not ``mcp.client.stdio.stdio_client``: it buffers a stdout line without limit (a server
that floods one giant line grows the broker's memory until it dies), sends the child's stderr
to ours, and does not expose the child's pid. This transport keeps the SDK's shutdown order
(close stdin, wait, then kill the whole process group) and adds:

- a per-message byte cap: a line (or an unterminated run of bytes) over ``max_message_bytes``
  marks the transport ``flooded``, kills the server's process group at once and closes the read
  stream, so every pending request fails with ``CONNECTION_CLOSED`` instead of waiting;
- the child's stderr in a bounded ring (the last few KiB, shown only to the user when a server
  fails to start, with secret-looking lines masked);
- ``pid`` / ``returncode`` for supervision and tests;
- ``kill()`` for a hard stop after a hang.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from contextlib import suppress
from types import TracebackType

import anyio
import anyio.abc
import anyio.lowlevel
import mcp_types as types
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from .config import StdioServerConfig

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "StdioTransport"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 8 << 20
_STDERR_TAIL = 8192
_READ_CHUNK = 1 << 16
_EXIT_POLL = 0.01


class StdioTransport:
    """Async context manager yielding ``(read_stream, write_stream)`` for ``mcp.Client``."""

    def __init__(
        self,
        config: StdioServerConfig,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        shutdown_grace: float = 2.0,
    ) -> None:
        self.config = config
        self.max_message_bytes = max_message_bytes
        self.shutdown_grace = shutdown_grace
        self.process: anyio.abc.Process | None = None
        self.flooded = False
        """True once the server sent a message over ``max_message_bytes``."""
        self._stderr = bytearray()
        self._tg: anyio.abc.TaskGroup | None = None
        self._streams: tuple = ()

    @property
    def pid(self) -> int | None:
        """The child's pid (also its process-group id), once started."""
        return self.process.pid if self.process is not None else None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process is not None else None

    def stderr_tail(self) -> str:
        """The last few KiB the server wrote to stderr (for start-failure messages; may hold secrets: mask)."""
        return self._stderr.decode("utf-8", "replace")

    def kill(self) -> None:
        """SIGKILL the server's whole process group now (after a hang or a flood)."""
        if self.process is None or self.process.returncode is not None:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    async def __aenter__(self):
        cfg = self.config
        env = get_default_environment() | dict(cfg.env)
        # start_new_session: the server and its children form one process group, killed together.
        self.process = await anyio.open_process(
            [cfg.command, *cfg.args],
            env=env,
            cwd=cfg.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        # No awaits between the spawn and the task group, or a cancellation here would leak the child.
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
        self._streams = (read_writer, read_stream, write_stream, write_reader)
        self._writer_done = anyio.Event()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._stdout_reader, read_writer)
        self._tg.start_soon(self._stdin_writer, write_reader, read_writer)
        self._tg.start_soon(self._stderr_reader)
        return read_stream, write_stream

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        with anyio.CancelScope(shield=True):
            await self._shutdown()
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(exc_type, exc, tb)

    async def _stdout_reader(self, read_writer) -> None:
        process = self.process
        assert process is not None and process.stdout is not None
        buffer = bytearray()
        try:
            async with read_writer:
                while True:
                    try:
                        chunk = await process.stdout.receive(_READ_CHUNK)
                    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                        return
                    buffer += chunk
                    while (nl := buffer.find(b"\n")) != -1:
                        line = bytes(buffer[:nl])
                        del buffer[: nl + 1]
                        if len(line) > self.max_message_bytes:
                            self._flood()
                            return
                        if line.strip():
                            await read_writer.send(_parse_line(line))
                    if len(buffer) > self.max_message_bytes:
                        self._flood()
                        return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return  # the session went away first

    def _flood(self) -> None:
        self.flooded = True
        logger.warning("MCP server %r sent a message over %d bytes; killing it", self.config.name,
                       self.max_message_bytes)
        self.kill()

    async def _stdin_writer(self, write_reader, read_writer) -> None:
        process = self.process
        assert process is not None and process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server stopped reading: end the session instead of leaving requests hanging.
            await read_writer.aclose()
        finally:
            self._writer_done.set()

    async def _stderr_reader(self) -> None:
        process = self.process
        assert process is not None and process.stderr is not None
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            while True:
                chunk = await process.stderr.receive(_READ_CHUNK)
                self._stderr += chunk
                if len(self._stderr) > _STDERR_TAIL:
                    del self._stderr[: len(self._stderr) - _STDERR_TAIL]

    async def _shutdown(self) -> None:
        """Close stdin, give the server ``shutdown_grace`` to exit, then kill its process group."""
        process = self.process
        assert process is not None
        read_writer, read_stream, write_stream, write_reader = self._streams
        write_stream.close()
        with anyio.move_on_after(0.5):
            await self._writer_done.wait()
        if process.stdin is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await process.stdin.aclose()
        if not await _wait_exit(process, self.shutdown_grace):
            await terminate_posix_process_tree(process, 1.0)
            if not await _wait_exit(process, 2.0):
                logger.warning("MCP server %r (pid %d) survived SIGKILL", self.config.name, process.pid)
        # Members of the group that outlived the leader (a server's own children) go too.
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await stream.aclose()
        for stream in (read_stream, write_stream, read_writer, write_reader):
            await stream.aclose()
        with suppress(Exception):
            await process.aclose()
        await anyio.lowlevel.checkpoint()


def _parse_line(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        # Returned, not raised: the session drops it; one bad line must not end the connection.
        return exc


async def _wait_exit(process: anyio.abc.Process, timeout: float) -> bool:
    """Poll ``returncode`` (not ``wait()``: on 3.11 that also waits for pipe EOF from grandchildren)."""
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(_EXIT_POLL)
        return True
    return process.returncode is not None
