"""Bearer keys the broker mints for its own subprocesses, and the loopback listener they reach it on.

Two broker listeners hand a key to a process the broker starts and take it back when that process's run ends:
relay's Anthropic endpoint for an engine's CLI (``broker/engine_endpoint.py``, one key per run) and the gated
MCP gateway (``broker/mcp_gateway.py``, one token per session). Both keep them here, the one way: a key is
``<prefix><32 random bytes, urlsafe>``, kept only as its SHA-256 digest, looked up by digest and compared in
constant time, refused past :data:`MAX_KEY_CHARS`, and forgotten when revoked. Nothing here logs a key.

Hand-written (a dict and ``secrets``/``hashlib``/``hmac``): no library keeps in-process bearer keys for a
tornado listener, and what matters is that both listeners do it identically.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["MAX_KEY_CHARS", "KeyRing", "listen_loopback"]

#: A presented key longer than this is refused before it is hashed.
MAX_KEY_CHARS = 512

H = TypeVar("H")


class KeyRing(Generic[H]):
    """Live keys, each naming its holder (a run's session). Not thread-safe: used on the broker's event loop."""

    def __init__(self) -> None:
        self._held: dict[bytes, H] = {}

    @staticmethod
    def new_key(prefix: str) -> str:
        return prefix + secrets.token_urlsafe(32)

    @staticmethod
    def digest(key: str) -> bytes:
        return hashlib.sha256(key.encode()).digest()

    def add(self, key: str, holder: H) -> None:
        self._held[self.digest(key)] = holder

    def find(self, presented: str) -> H | None:
        """The holder of ``presented``, or None (empty, too long, unknown or revoked)."""
        if not presented or len(presented) > MAX_KEY_CHARS:
            return None
        digest = self.digest(presented)
        for known, holder in self._held.items():
            # every live key is compared, each in constant time: no early exit tells how much matched
            if hmac.compare_digest(digest, known):
                return holder
        return None

    def pop(self, key: str) -> H | None:
        """Revoke ``key``; its holder if it was live."""
        return self._held.pop(self.digest(key), None)

    def drop(self, which: Callable[[H], bool]) -> int:
        """Revoke every key whose holder ``which`` picks; how many."""
        gone = [d for d, holder in self._held.items() if which(holder)]
        for d in gone:
            del self._held[d]
        return len(gone)

    def clear(self) -> None:
        self._held.clear()

    def __len__(self) -> int:
        return len(self._held)


def listen_loopback(app: Any, max_body_size: int) -> tuple[Any, int]:
    """Serve tornado ``app`` on a free port of 127.0.0.1 only; (the ``HTTPServer``, its port)."""
    from tornado.httpserver import HTTPServer

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    server = HTTPServer(app, max_body_size=max_body_size, xheaders=False)
    server.add_sockets([sock])
    return server, sock.getsockname()[1]
