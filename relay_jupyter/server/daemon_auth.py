"""Authentication of the standalone daemon's TCP listener, and the auth log of both transports.

- **Token**: 32 random bytes (``secrets.token_urlsafe(32)``, 43 characters) in ``<data dir>/daemon_token``,
  mode 0600, written atomically. :class:`TokenSource` re-reads it when the file changes (one ``stat``
  per check), so ``jupyter relay token rotate`` takes effect in a running daemon without a restart.
- **Check**: ``Authorization: Bearer <token>``, compared with :func:`hmac.compare_digest` on bytes.
  A missing, malformed or wrong token gets the same 401 (:data:`UNAUTHORIZED_BODY`, fixed headers).
- **Cooldown**: :class:`FailureTracker`: 3 failures from one peer address within 10 s refuse that peer
  for 60 s (429 + ``Retry-After``), whatever it sends. Peers are keyed by IP: on loopback every
  local process shares one address, so another local user can lock out loopback clients for a
  minute (a nuisance, never a bypass); the Unix socket transport has no such cooldown.
- **Auth log**: :class:`AuthLog`, JSON lines in ``<data dir>/logs/auth.jsonl`` rotated by size
  (``logging.handlers.RotatingFileHandler``). It records outcome, transport, peer and reason, never
  a token or header value.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import logging.handlers
import math
import os
import re
import secrets
import socket
import stat
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from tornado import web

from ..core.caller import Caller, CallerKind
from ..core.errors import Code, ConfigRefusal
from ..protocol.notebook_identity import ANONYMOUS_PREFIX, client_name_for, loopback_peer_pid, notebook_of_process
from ..storage.atomic import atomic_write_bytes
from .plain import refuse

__all__ = [
    "CLIENT_NAME",
    "COOLDOWN_BODY",
    "KERNEL_HEADER",
    "KERNEL_KEY_FILE",
    "KERNEL_KEY_GRACE_SECONDS",
    "PREVIOUS_KERNEL_KEY_FILE",
    "RESERVED_BODY",
    "RESERVED_PREFIX",
    "TERMINAL_CLIENT",
    "TOKEN_FILE",
    "URL_CREDENTIAL_PARAMS",
    "URL_TOKEN_BODY",
    "AuthLog",
    "DaemonGate",
    "FailureTracker",
    "KernelRegistry",
    "TokenSource",
    "check_bearer",
    "daemon_caller",
    "ensure_token",
    "kernel_caller",
    "read_token",
    "rotate_token",
    "token_path",
    "url_has_credentials",
]

TOKEN_FILE = "daemon_token"
_TOKEN_MAX = 4096

COOLDOWN_BODY = b'{"message": "too many failed authentication attempts; retry later"}'
URL_TOKEN_BODY = (b'{"message": "credentials in the URL are refused; send them in the Authorization header"}')

#: Query parameters that carry a credential in some client's convention: a request with any of them
#: is refused, whatever the value (so the answer never depends on the secret).
URL_CREDENTIAL_PARAMS = frozenset({"token", "access_token", "auth", "authorization", "bearer", "api_key",
                                   "apikey", "key", "password", "relay_token"})


def token_path(data_dir: Path) -> Path:
    """``<data dir>/daemon_token``."""
    return Path(data_dir) / TOKEN_FILE


def read_token(path: Path) -> bytes | None:
    """The token in ``path``, or None when the file is missing or empty.

    Raises:
        ConfigRefusal: CONFIG_INVALID when the file is readable by others, owned by someone else,
            not a regular file, or absurdly large.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"cannot read the daemon token {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"daemon token {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise ConfigRefusal(Code.CONFIG_INVALID, f"daemon token {path} is owned by another user")
        if st.st_mode & 0o077:
            raise ConfigRefusal(Code.CONFIG_INVALID,
                                f"daemon token {path} is readable by other users "
                                f"(mode {stat.S_IMODE(st.st_mode):04o}); run: jupyter relay token rotate")
        data = os.read(fd, _TOKEN_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > _TOKEN_MAX:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"daemon token {path} is not a token (too large)")
    value = data.strip()
    return value or None


def _new_token() -> bytes:
    return secrets.token_urlsafe(32).encode("ascii")


def ensure_token(path: Path) -> None:
    """Create the token file (0600) when it does not exist yet; check it when it does."""
    if read_token(path) is None:
        atomic_write_bytes(path, _new_token() + b"\n", mode=0o600)


def rotate_token(path: Path) -> None:
    """Replace the token with a fresh one (atomic write, 0600). Clients using the old one get 401."""
    atomic_write_bytes(path, _new_token() + b"\n", mode=0o600)


class TokenSource:
    """The current token, re-read when the file's identity (inode, mtime, size) changes.

    ``generation`` counts changes, so that streams opened with an older token can be closed.
    A file that is missing, unreadable or unsafe yields None: every request is refused (fail closed).
    """

    def __init__(self, path: Path, *, log: logging.Logger | None = None) -> None:
        self.path = Path(path)
        self.generation = 0
        self._sig: tuple[int, int, int] | None = None
        self._token: bytes | None = None
        self._log = log or logging.getLogger("relay_jupyter.daemon")
        self.current()

    def current(self) -> bytes | None:
        """The token now in force (never log it)."""
        try:
            st = os.stat(self.path)
            sig: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            sig = None
        if sig != self._sig:
            try:
                token = read_token(self.path) if sig is not None else None
            except ConfigRefusal as exc:
                self._log.error("%s; refusing every TCP request until it is fixed", exc.message)
                token = None
            if self._sig is not None or self._token is not None:
                self.generation += 1
                self._log.info("daemon token changed on disk; connections using the old token must reconnect")
            self._sig, self._token = sig, token
        return self._token


def check_bearer(header: str | None, token: bytes | None) -> tuple[bool, str]:
    """``(ok, reason)`` for an ``Authorization`` header value; reason is ``ok|missing|malformed|wrong``.

    The scheme is case-insensitive (RFC 7235); the token is compared in constant time on bytes.
    """
    expected = token if token is not None else b"\x00" * 43
    if not header:
        hmac.compare_digest(expected, expected)  # similar work on every path
        return False, "missing"
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    try:
        given = value.encode("ascii")
    except UnicodeEncodeError:
        given = b""
    if scheme.lower() != "bearer" or not given or " " in value:
        hmac.compare_digest(expected, expected)
        return False, "malformed"
    same = hmac.compare_digest(given, expected)
    return (same and token is not None), ("ok" if same and token is not None else "wrong")


def url_has_credentials(query_arguments: dict[str, Any]) -> bool:
    """True when the query string has a parameter that conventionally carries a credential."""
    return any(name.lower() in URL_CREDENTIAL_PARAMS for name in query_arguments)


class FailureTracker:
    """Failed attempts per peer; ``limit`` failures within ``window`` seconds start a ``cooldown``.

    Memory is bounded: at most ``max_peers`` peers are tracked (the least recently failing are forgotten).
    """

    def __init__(self, *, limit: int = 3, window: float = 10.0, cooldown: float = 60.0, max_peers: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.cooldown, self.max_peers = limit, window, cooldown, max_peers
        self._clock = clock
        self._fails: OrderedDict[str, deque[float]] = OrderedDict()
        self._until: dict[str, float] = {}

    def cooldown_left(self, peer: str) -> float:
        """Seconds of cooldown left for ``peer`` (0 when none)."""
        until = self._until.get(peer)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._until[peer]
            return 0.0
        return left

    def retry_after(self, peer: str) -> int:
        """The ``Retry-After`` value in whole seconds (at least 1)."""
        return max(1, math.ceil(self.cooldown_left(peer)))

    def failure(self, peer: str) -> bool:
        """Record one failure; True when it starts a cooldown."""
        now = self._clock()
        fails = self._fails.pop(peer, None) or deque()
        fails.append(now)
        while fails and now - fails[0] > self.window:
            fails.popleft()
        if len(fails) >= self.limit:
            self._until[peer] = now + self.cooldown
            return True
        self._fails[peer] = fails
        while len(self._fails) > self.max_peers:
            self._fails.popitem(last=False)
        if len(self._until) > self.max_peers:
            for key in [k for k, v in self._until.items() if v <= now]:
                del self._until[key]
        return False


class _JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {"ts": round(record.created, 3), **getattr(record, "relay_auth", {})}
        return json.dumps(payload, sort_keys=True)


class AuthLog:
    """Auth events as JSON lines in ``<data dir>/logs/auth.jsonl``, rotated at ``max_bytes`` (``keep`` old files).

    Callers pass only what is safe to store: outcome, transport, peer, reason. There is no parameter
    for a credential.
    """

    def __init__(self, path: Path, *, max_bytes: int = 5 << 20, keep: int = 3) -> None:
        self.path = Path(path)
        old = os.umask(0o077)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._handler = logging.handlers.RotatingFileHandler(self.path, maxBytes=max_bytes, backupCount=keep,
                                                                 encoding="utf-8")
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._handler.setFormatter(_JsonLines())
        # a private logger: auth events never propagate into the daemon log or stderr
        self._logger = logging.Logger("relay_jupyter.daemon.auth")  # noqa: LOG001 - unregistered on purpose
        self._logger.addHandler(self._handler)
        self._logger.propagate = False

    def event(self, outcome: str, transport: str, peer: dict[str, Any], *, reason: str | None = None,
              path: str | None = None) -> None:
        """Append one auth event (``accepted | refused | cooldown_started | cooldown``)."""
        fields: dict[str, Any] = {"event": "auth", "outcome": outcome, "transport": transport, "peer": peer}
        if reason is not None:
            fields["reason"] = reason
        if path is not None:
            fields["path"] = path
        old = os.umask(0o077)  # a rotation creates the new file: keep it private
        try:
            self._logger.info("auth", extra={"relay_auth": fields})
        finally:
            os.umask(old)

    def close(self) -> None:
        self._handler.close()


KERNEL_KEY_FILE = "daemon_kernel_key"
#: The key before the last ``jupyter relay token rotate --kernel-key``, and until when it is still accepted:
#: ``{"key": ..., "until": <epoch s>}`` (0600). Kernels registered before the rotation keep working that long.
PREVIOUS_KERNEL_KEY_FILE = "daemon_kernel_key.previous"
#: How long credentials of the previous kernel key stay valid after a rotation, by default (1 day).
KERNEL_KEY_GRACE_SECONDS = 86_400
#: The header a registered kernel sends its daemon credential in (with the bearer token on TCP).
KERNEL_HEADER = "X-Relay-Kernel"
#: Client names a daemon reserves for registered kernels: ``X-Relay-Client: kernel:...`` without a credential
#: is refused, so no client becomes a notebook's origin by naming it.
RESERVED_PREFIX = "kernel:"
_CREDENTIAL_VERSION = "rk1"
_MAX_CREDENTIAL = 512
_MAX_CLAIM = 4096


def _file_sig(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read_previous_key(path: Path) -> tuple[bytes, float] | None:
    """``(key, until)`` from :data:`PREVIOUS_KERNEL_KEY_FILE`, or None (none, unsafe, malformed: fail closed)."""
    try:
        raw = read_token(path)
    except ConfigRefusal:
        return None
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        key, until = data["key"], float(data["until"])
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(key, str) or not key or until != until:
        return None
    return key.encode("ascii", "replace"), until


def rotate_kernel_key(key_path: Path, grace: float = KERNEL_KEY_GRACE_SECONDS, *,
                      clock: Callable[[], float] = time.time) -> None:
    """Replace the daemon's kernel key (atomic, 0600); its credentials stay valid ``grace`` seconds more (the old key
    in :data:`PREVIOUS_KERNEL_KEY_FILE`), none with ``grace`` 0. A running daemon notices at its next verify.

    Raises:
        ConfigRefusal: the key file is unsafe (see :func:`read_token`), or ``grace`` is negative.
    """
    if not grace >= 0:
        raise ConfigRefusal(Code.CONFIG_INVALID, "the grace period of a kernel key rotation must be >= 0 seconds")
    key_path = Path(key_path)
    previous = key_path.with_name(key_path.name + ".previous")
    old = read_token(key_path)
    if old is not None and grace > 0:
        atomic_write_bytes(previous, json.dumps({"key": old.decode("ascii"), "until": clock() + grace}).encode(),
                           mode=0o600)
    else:
        try:
            previous.unlink()
        except FileNotFoundError:
            pass
    atomic_write_bytes(key_path, _new_token() + b"\n", mode=0o600)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class KernelRegistry:
    """The daemon's kernel credentials: ``POST /relay/kernel`` issues one, bound to an origin the daemon
    derives itself (issue 19 item 4; docs/daemon.md "Each headless notebook is its own origin").

    - **Origin**: on the Unix socket the daemon reads the *peer process* (``SO_PEERCRED`` pid): the
      environment it was started with (``RELAY_NOTEBOOK``, ``JPY_SESSION_NAME``) and the command line of the
      runner that started it (papermill, jupyter execute, nbconvert, pytest --nbval); the kernel's own claim
      (``X-Relay-Notebook``) is ignored there. Over TCP from ``127.0.0.1`` the peer process is found through
      ``/proc/net/tcp`` (``loopback_peer_pid``) and read the same way; only a peer the daemon cannot find (another
      host, a container) is named by its claim (every token holder is the user). No path: a fresh
      ``daemon:kernel:anon-<12 hex>``.
    - **Credential**: ``rk1.<origin, base64url>.<HMAC-SHA256 of both under the daemon's kernel key>``; the key
      is 32 random bytes in ``<data dir>/daemon_kernel_key`` (0600). Stateless, so a daemon that idled out and
      was started again still knows a running kernel's origin; later requests cannot change the origin (it
      is inside the MAC). Written by hand rather than with a token library: one HMAC over two fields, with
      the standard library's ``hmac.compare_digest``.

    Rotation (``jupyter relay token rotate --kernel-key``, :func:`rotate_kernel_key`): a new key is written and
    the old one kept in :data:`PREVIOUS_KERNEL_KEY_FILE` with a deadline. The daemon re-reads both when a file
    changes (one ``stat`` each per verify), issues under the new key only and accepts the previous key's
    credentials until the deadline, so running kernels keep working through a rotation and need a restart only
    after the grace period; ``--grace 0`` refuses them at once (a key that leaked).
    """

    def __init__(self, key_path: Path, *, log: logging.Logger | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.key_path = Path(key_path)
        self.previous_path = self.key_path.with_name(self.key_path.name + ".previous")
        if read_token(self.key_path) is None:
            atomic_write_bytes(self.key_path, _new_token() + b"\n", mode=0o600)
        key = read_token(self.key_path)
        assert key is not None
        self._key = key
        self._clock = clock
        self._sigs: tuple[Any, Any] = (_file_sig(self.key_path), _file_sig(self.previous_path))
        self._previous = _read_previous_key(self.previous_path)
        self._log = log or logging.getLogger("relay_jupyter.daemon")

    def _refresh(self) -> None:
        """Re-read the key files when either changed (a rotation); a file that became unsafe or unreadable keeps
        the keys in memory for issuing and, fail closed, accepts no previous key."""
        sigs = (_file_sig(self.key_path), _file_sig(self.previous_path))
        if sigs == self._sigs:
            return
        self._sigs = sigs
        try:
            key = read_token(self.key_path)
        except ConfigRefusal as exc:
            self._log.warning("relay: the kernel key file is refused (%s); keeping the key in memory", exc.message)
            key = None
        if key is not None and key != self._key:
            self._key = key
            self._log.info("relay: the kernel credential key was rotated")
        self._previous = _read_previous_key(self.previous_path)

    def _mac(self, body: str, key: bytes | None = None) -> str:
        return _b64(hmac.new(key or self._key, body.encode("ascii"), hashlib.sha256).digest())

    def issue(self, origin: str) -> str:
        """A credential for ``origin`` (under the current key)."""
        self._refresh()
        body = f"{_CREDENTIAL_VERSION}.{_b64(origin.encode('utf-8', 'surrogatepass'))}"
        return f"{body}.{self._mac(body)}"

    def verify(self, credential: str) -> str | None:
        """The origin ``credential`` was issued for, or None (malformed, tampered, another daemon's key)."""
        if not credential or len(credential) > _MAX_CREDENTIAL or not credential.isascii():
            return None
        self._refresh()
        body, _, mac = credential.rpartition(".")
        if not body.startswith(_CREDENTIAL_VERSION + "."):
            return None
        valid = hmac.compare_digest(mac, self._mac(body))
        if not valid and self._previous is not None and self._clock() < self._previous[1]:
            valid = hmac.compare_digest(mac, self._mac(body, self._previous[0]))  # within the rotation's grace
        if not valid:
            return None
        try:
            origin = _unb64(body[len(_CREDENTIAL_VERSION) + 1:]).decode("utf-8", "surrogatepass")
        except (ValueError, UnicodeDecodeError):
            return None
        return origin if origin.startswith("daemon:" + RESERVED_PREFIX) else None

    def derive(self, handler: web.RequestHandler, claim: str | None) -> tuple[str | None, str]:
        """``(notebook path, source)`` of the kernel behind ``handler``'s connection (see the class docstring)."""
        stream = getattr(handler.request.connection, "stream", None)
        sock = getattr(stream, "socket", None)
        if sock is not None and sock.family == socket.AF_UNIX:
            from .unix import peer_credentials

            try:
                pid, _uid, _gid = peer_credentials(sock)
            except OSError:
                return None, "none"
            return notebook_of_process(pid)
        # TCP from this machine: the peer process is found through /proc as well, and its claim ignored
        try:
            local = sock.getsockname() if sock is not None else None
            peer = sock.getpeername() if sock is not None else None
        except OSError:
            local = peer = None
        if local and peer and peer[0] == "127.0.0.1":
            pid = loopback_peer_pid((peer[0], peer[1]), (local[0], local[1]))
            if pid is not None:
                return notebook_of_process(pid)
        if claim:
            return claim, "claimed"
        return None, "none"

    def register(self, handler: web.RequestHandler) -> dict[str, Any]:
        """The answer to ``POST /relay/kernel``: ``{credential, origin, notebook, source}``."""
        raw = handler.request.headers.get("X-Relay-Notebook", "")
        claim = unquote(raw).strip() if raw and len(raw) <= _MAX_CLAIM else None
        path, source = self.derive(handler, claim or None)
        if path and "\x00" not in path:
            origin = "daemon:" + client_name_for(path)
        else:
            path, source = None, "none"
            origin = "daemon:" + ANONYMOUS_PREFIX + secrets.token_hex(6)
        self._log.info("kernel registered as %s (notebook from the %s)", origin,
                       {"environment": "kernel's environment", "runner": "runner's command line",
                        "claimed": "kernel's claim (TCP)"}.get(source, "nowhere: a fresh origin"))
        return {"credential": self.issue(origin), "origin": origin, "notebook": path, "source": source}


CLIENT_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_OPEN_ENDPOINTS = frozenset({"healthz", "readyz", "metrics"})
_JSON = (("Content-Type", "application/json"), ("Cache-Control", "no-store"))


def daemon_caller(name: str) -> Caller:
    """The caller of a daemon client named ``name``: origin and client id ``daemon:<name>``.

    The client id does not depend on the connection, so the originator of a run answers its
    permission requests from any later connection (every client of one daemon is the same user;
    the name is a label that keeps grants apart, not a security boundary).
    """
    return Caller(kind=CallerKind.DAEMON, origin=f"daemon:{name}", client_id=f"daemon:{name}",
                  stops_all=name == TERMINAL_CLIENT)


#: The 403 of ``X-Relay-Client: kernel:...`` without a kernel credential.
RESERVED_BODY = (b'{"message": "X-Relay-Client kernel:... names a registered kernel: a kernel gets its origin from '
                 b'POST /relay/kernel and sends the credential as X-Relay-Kernel"}')
#: The daemon client name of ``jupyter relay kill``: it may stop every run of the daemon.
TERMINAL_CLIENT = "terminal"


def kernel_caller(origin: str) -> Caller:
    """The caller of a kernel registered with the daemon: ``kind=kernel``, origin and client id the origin the
    daemon bound to its credential."""
    return Caller(kind=CallerKind.KERNEL, origin=origin, client_id=origin)


class DaemonGate:
    """The daemon's ``resolve_caller`` and ``activity`` for :func:`relay_jupyter.server.plain.make_app`.

    ``transport="unix"``: the connection was accepted from our own uid (:mod:`.unix`), so only the
    client name is read. ``transport="tcp"``: cooldown, then credentials in the URL (400), then the
    bearer token (the fixed 401), on every path; ``unauthenticated_metrics`` exempts
    ``healthz``/``readyz``/``metrics``.
    """

    def __init__(self, transport: str, *, tokens: TokenSource | None = None, auth_log: AuthLog | None = None,
                 tracker: FailureTracker | None = None, unauthenticated_metrics: bool = False,
                 kernels: KernelRegistry | None = None) -> None:
        if transport not in ("unix", "tcp"):
            raise ValueError("transport is 'unix' or 'tcp'")
        if transport == "tcp" and tokens is None:
            raise ValueError("a tcp gate needs a token source")
        self.transport = transport
        self.tokens = tokens
        self.auth_log = auth_log
        self.tracker = tracker or FailureTracker()
        self.unauthenticated_metrics = unauthenticated_metrics
        self.kernels = kernels
        """Verifies ``X-Relay-Kernel`` credentials (None: no kernel is registered; the reserved names stay refused)."""
        self.last_activity = time.monotonic()
        self.in_flight: set[Any] = set()
        self._streams: dict[Any, int] = {}

    # -- activity (idle timer, token rotation) -------------------------------------------------

    def started(self, handler: Any) -> None:
        self.in_flight.add(handler)
        self.last_activity = time.monotonic()

    def ended(self, handler: Any) -> None:
        if handler in self.in_flight:
            self.in_flight.discard(handler)
            self.last_activity = time.monotonic()
        self._streams.pop(handler, None)

    def idle_for(self) -> float:
        """Seconds since the last request ended; 0 while any request (an event stream included) is open."""
        return 0.0 if self.in_flight else time.monotonic() - self.last_activity

    def refresh(self) -> int:
        """Re-read the token; close event streams authenticated with an older one. Returns how many."""
        if self.tokens is None:
            return 0
        self.tokens.current()
        stale = [h for h, gen in self._streams.items() if gen != self.tokens.generation]
        for handler in stale:
            self._streams.pop(handler, None)
            connection = handler.request.connection
            if connection is not None and getattr(connection, "stream", None) is not None:
                connection.stream.close()
        return len(stale)

    def scrub(self, path: str) -> str:
        """``path`` with the token masked, should a client have put it there."""
        token = self.tokens.current() if self.tokens is not None else None
        if token:
            text = token.decode("ascii", "replace")
            if text in path:
                path = path.replace(text, "<redacted>")
        return path

    # -- resolve_caller --------------------------------------------------------------------------

    def __call__(self, handler: web.RequestHandler) -> Caller | None:
        if self.transport == "tcp" and not self._admit_tcp(handler):
            return None
        credential = handler.request.headers.get(KERNEL_HEADER)
        if credential is not None:
            # a registered kernel: its origin is the one the daemon bound to its credential, whatever it names
            origin = self.kernels.verify(credential.strip()) if self.kernels is not None else None
            if origin is None:
                self._log("refused", {"transport": self.transport}, reason="kernel_credential",
                          path=self.scrub(handler.request.path)[:200])
                return None
            return kernel_caller(origin)
        name = handler.request.headers.get("X-Relay-Client", "default")
        if not CLIENT_NAME.match(name):
            refuse(handler, 400, b'{"message": "X-Relay-Client must be 1-64 of [A-Za-z0-9_.:-]"}', _JSON)
            return None
        if name.startswith(RESERVED_PREFIX):
            refuse(handler, 403, RESERVED_BODY, _JSON)
            return None
        return daemon_caller(name)

    def _log(self, outcome: str, peer: dict[str, Any], **extra: Any) -> None:
        if self.auth_log is not None:
            self.auth_log.event(outcome, self.transport, peer, **extra)

    def _fail(self, ip: str, reason: str, path: str) -> None:
        started = self.tracker.failure(ip)
        self._log("refused", {"ip": ip}, reason=reason, path=path)
        if started:
            self._log("cooldown_started", {"ip": ip})

    def _admit_tcp(self, handler: web.RequestHandler) -> bool:
        """True to go on; False after answering (429, 400) or to get the fixed 401 (nothing written)."""
        request = handler.request
        endpoint = getattr(handler, "relay_endpoint", "unknown")
        if self.unauthenticated_metrics and endpoint in _OPEN_ENDPOINTS and not request.query:
            return True
        ip = request.remote_ip or "?"
        path = self.scrub(request.path)[:200]
        if self.tracker.cooldown_left(ip) > 0:
            self._log("cooldown", {"ip": ip}, path=path)
            refuse(handler, 429, COOLDOWN_BODY, (*_JSON, ("Retry-After", str(self.tracker.retry_after(ip)))))
            return False
        if url_has_credentials(request.query_arguments):
            self._fail(ip, "token_in_url", path)
            refuse(handler, 400, URL_TOKEN_BODY, _JSON)
            return False
        assert self.tokens is not None
        ok, reason = check_bearer(request.headers.get("Authorization"), self.tokens.current())
        if not ok:
            self._fail(ip, reason, path)
            return False
        connection = request.connection
        if not getattr(connection, "_relay_accepted", False):  # logged once per connection, not per request
            self._log("accepted", {"ip": ip})
            try:
                connection._relay_accepted = True  # type: ignore[union-attr]
            except AttributeError:
                pass
        if endpoint == "events":
            self._streams[handler] = self.tokens.generation
        return True
