"""Local transport helpers shared by the daemon, the kernel's broker discovery and the test brokers."""

from __future__ import annotations

import http.client
import socket
from pathlib import Path

__all__ = ["UnixHTTPConnection", "unix_socket_answers"]


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix socket (the standard library has no such class)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def unix_socket_answers(path: Path, timeout: float = 0.5) -> bool:
    """True when something accepts connections on the Unix socket ``path`` (a live daemon), False for a
    missing path, a stale socket file left by a killed process, or a refused connection."""
    if not path.exists():
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()
