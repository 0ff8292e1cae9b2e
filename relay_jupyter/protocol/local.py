"""Local transport helpers shared by the daemon, the kernel's broker discovery and the test brokers."""

from __future__ import annotations

import socket
from pathlib import Path

__all__ = ["unix_socket_answers"]


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
