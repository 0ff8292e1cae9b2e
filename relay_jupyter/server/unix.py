"""The daemon's Unix socket: a private directory, a 0600 socket, and the peer's uid checked on accept.

Filesystem permissions are the first fence (the parent directory is 0700 and owned by us, the
socket 0600); ``SO_PEERCRED`` is the second: a connection from another uid is answered with one
403 and closed before any HTTP is parsed. No bearer token is used on the socket.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream, StreamClosedError
from tornado.netutil import bind_unix_socket

from ..core.errors import Code, ConfigRefusal
from ..protocol.local import unix_socket_answers

__all__ = [
    "REFUSED_PEER_RESPONSE",
    "PeerCheckingHTTPServer",
    "bind_private_unix_socket",
    "check_socket_dir",
    "peer_credentials",
]

_REFUSED_BODY = b'{"message": "this relay daemon only serves the user running it"}'
#: What a connection from another uid receives before it is closed.
REFUSED_PEER_RESPONSE = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(_REFUSED_BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + _REFUSED_BODY
)

_UNIX_PATH_MAX = 107
_DRAIN_SECONDS = 1.0
_DRAIN_BYTES = 65536  # sun_path is 108 bytes on Linux, including the NUL


def check_socket_dir(path: Path, *, create: bool = True) -> Path:
    """Make sure the socket's parent directory is ours and private (0700); create it if missing.

    An existing directory that the group or others can access, or that another user owns, is
    refused rather than fixed: someone else may already have a foothold in it.

    Raises:
        ConfigRefusal: CONFIG_INVALID with a message naming the path and the fix.
    """
    parent = path.parent
    if len(os.fsencode(str(path))) > _UNIX_PATH_MAX:
        raise ConfigRefusal(Code.CONFIG_INVALID,
                            f"unix socket path {path} is longer than {_UNIX_PATH_MAX} bytes; choose a shorter one")
    if not parent.exists():
        if not create:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"socket directory {parent} does not exist")
        old = os.umask(0o077)
        try:
            parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        finally:
            os.umask(old)
    st = os.lstat(parent)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigRefusal(Code.CONFIG_INVALID, f"socket directory {parent} is a symlink; refusing it")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigRefusal(Code.CONFIG_INVALID, f"socket directory {parent} is not a directory")
    if st.st_uid != os.geteuid():
        raise ConfigRefusal(Code.CONFIG_INVALID, f"socket directory {parent} is owned by another user; "
                                                 "use a directory of your own")
    if st.st_mode & 0o077:
        raise ConfigRefusal(
            Code.CONFIG_INVALID,
            f"socket directory {parent} is accessible to other users (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"run: chmod 700 {parent}",
        )
    return parent




def bind_private_unix_socket(path: Path) -> socket.socket:
    """Bind a listening Unix socket at ``path`` with mode 0600 inside a checked 0700 directory.

    A stale socket file (nothing answers) is replaced; a live one is refused.

    Raises:
        ConfigRefusal: CONFIG_INVALID (directory not private, another daemon listens, not a socket).
    """
    check_socket_dir(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{path} exists and is not a socket; refusing to replace it")
        if unix_socket_answers(path):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"a relay daemon already listens on {path}")
    # umask as well as tornado's chmod: the socket is never, even briefly, more open than 0600
    old = os.umask(0o177)
    try:
        sock = bind_unix_socket(str(path), mode=0o600)
    except OSError as exc:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"cannot listen on {path}: {exc.strerror}") from None
    finally:
        os.umask(old)
    return sock


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a connected Unix socket (Linux SO_PEERCRED).

    Raises:
        OSError: the platform or socket does not support it.
    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


class PeerCheckingHTTPServer(HTTPServer):
    """An ``HTTPServer`` for Unix sockets that refuses every connection from a uid other than ours.

    ``on_refused(peer)`` is called with ``{"pid", "uid"}`` (or ``{"error"}``) of a refused peer, for the
    auth log. A peer whose credentials cannot be read is refused too (fail closed).
    """

    def initialize(self, *args: Any, on_refused: Callable[[dict[str, Any]], None] | None = None,
                   expected_uid: int | None = None, **kwargs: Any) -> None:
        super().initialize(*args, **kwargs)
        self._on_refused = on_refused
        self._expected_uid = os.geteuid() if expected_uid is None else expected_uid

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        peer: dict[str, Any]
        try:
            pid, uid, _gid = peer_credentials(stream.socket)
            peer = {"pid": pid, "uid": uid}
            ok = uid == self._expected_uid
        except OSError as exc:
            peer = {"error": errno.errorcode.get(exc.errno or 0, "unknown")}
            ok = False
        if ok:
            super().handle_stream(stream, address)
            return
        if self._on_refused is not None:
            self._on_refused(peer)
        IOLoop.current().add_future(asyncio.ensure_future(_refuse(stream)), lambda _f: None)


async def _refuse(stream: IOStream) -> None:
    """Send the 403, then drain briefly before closing: closing a Unix socket with unread data makes
    the peer's read fail with ECONNRESET before it sees the answer. Bounded in time and bytes."""
    try:
        await stream.write(REFUSED_PEER_RESPONSE)
        stream.socket.shutdown(socket.SHUT_WR)
        async with asyncio.timeout(_DRAIN_SECONDS):
            await stream.read_bytes(_DRAIN_BYTES, partial=True)
    except (StreamClosedError, OSError, TimeoutError):
        pass
    finally:
        stream.close()
