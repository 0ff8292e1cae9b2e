"""The standalone daemon: the broker and the relay endpoints outside Jupyter (``jupyter relay serve``).

    jupyter relay serve --listen unix:///run/user/1000/jupyter/relay/relay.sock --idle-timeout 600
    jupyter relay serve --listen tcp://127.0.0.1:8765 [--unauthenticated-metrics]

Files (``<data dir>`` is ``<jupyter data dir>/relay`` unless ``--data-dir``; ``<runtime>`` is
``<jupyter runtime dir>/relay``):

- ``<data dir>/relay.db``, ``audit-daemon.jsonl``: the broker's store as inside Jupyter, with its own audit log (a log may have several writers, docs/storage.md; a file of its own keeps the daemon's decisions apart);
- ``<data dir>/daemon_token``: the TCP bearer token (0600), created on the first TCP start;
- ``<data dir>/daemon_kernel_key``: the key of the kernel credentials (0600; ``daemon_auth.KernelRegistry``);
- ``<data dir>/logs/daemon.log`` (rotated) and ``logs/auth.jsonl``: what ``jupyter relay logs`` prints;
- ``<runtime>/daemon-<pid>.json``: the state file ``jupyter relay status|stop`` read (listen
  address, pid, start time, data dir); removed on a clean exit, ignored once its pid is gone.

SIGTERM and SIGINT stop it gracefully: the listener closes, open connections (event streams
included) are closed, pending permission requests are denied, the store is closed, the socket
and state files are removed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import logging.handlers
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tornado.httpserver import HTTPServer
from tornado.ioloop import PeriodicCallback
from tornado.netutil import bind_sockets

from ..broker.assembly import install_components, start_components
from ..broker.broker import Broker
from ..broker.config import BrokerConfig
from ..core.errors import Code, ConfigRefusal
from ..storage.atomic import atomic_write_json
from ..storage.paths import data_dir as default_data_dir
from ..storage.paths import ensure_private_dir, runtime_dir
from .daemon_auth import KERNEL_KEY_FILE, AuthLog, DaemonGate, KernelRegistry, TokenSource, ensure_token, token_path
from .plain import make_app, shut_down
from .server_state import pid_alive
from .conn_guard import GuardedHTTPServer
from .unix import PeerCheckingHTTPServer, bind_private_unix_socket

__all__ = [
    "AUTH_LOG",
    "DAEMON_LOG",
    "LOG_DIR",
    "DaemonOptions",
    "Listen",
    "active_run_count",
    "default_socket_path",
    "parse_listen",
    "read_states",
    "run",
    "serve",
    "state_dir",
]

log = logging.getLogger("relay_jupyter.daemon")

LOG_DIR = "logs"
DAEMON_LOG = "daemon.log"
AUTH_LOG = "auth.jsonl"
_PRUNE_EVERY_MS = 3_600_000
_SHUTDOWN_GRACE = 5.0


@dataclass(frozen=True)
class Listen:
    """A parsed ``--listen`` address."""

    kind: str
    """``unix`` or ``tcp``."""
    path: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0

    def display(self, port: int | None = None) -> str:
        """The address as a URL (``port`` = the bound one, for ``tcp://host:0``)."""
        if self.kind == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port if port is None else port}"


def state_dir() -> Path:
    """``<jupyter runtime dir>/relay`` (private)."""
    return runtime_dir() / "relay"


def default_socket_path() -> Path:
    """``<jupyter runtime dir>/relay/relay.sock``: where the kernel side looks (kernel/discovery.py)."""
    return state_dir() / "relay.sock"


def parse_listen(spec: str | None) -> Listen:
    """Parse ``unix:///abs/path`` or ``tcp://HOST:PORT`` (None: the default Unix socket).

    Raises:
        ConfigRefusal: CONFIG_INVALID with the accepted forms.
    """
    if not spec:
        return Listen("unix", path=default_socket_path())
    usage = "--listen takes unix:///absolute/path.sock or tcp://127.0.0.1:PORT"
    try:
        parts = urlsplit(spec)
        port = parts.port if parts.scheme == "tcp" else None
    except ValueError:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"{usage} (got {spec!r})") from None
    if parts.scheme == "unix":
        raw = (parts.netloc + parts.path) if parts.netloc else parts.path
        if not raw.startswith("/") or parts.query or parts.fragment or "\x00" in raw:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{usage} (got {spec!r})")
        return Listen("unix", path=Path(raw))
    if parts.scheme == "tcp":
        if not parts.hostname or port is None or parts.path not in ("", "/") or parts.username or parts.query:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{usage} (got {spec!r})")
        return Listen("tcp", host=parts.hostname, port=port)
    raise ConfigRefusal(Code.CONFIG_INVALID, f"{usage} (got {spec!r})")


@dataclass(frozen=True)
class DaemonOptions:
    """What ``jupyter relay serve`` was asked to do."""

    listen: Listen
    config: BrokerConfig
    unauthenticated_metrics: bool = False
    idle_timeout: float | None = None
    """Exit after this many seconds with no active runs and no requests (None: never)."""
    log_level: int = logging.INFO
    """The level of relay's loggers in the daemon log and on stderr (``--debug``: DEBUG)."""
    config_files: tuple[str, ...] = ()
    """The Jupyter config files the settings were read from (logged at startup)."""


def active_run_count(broker: Broker) -> int:
    """Runs not yet finished (the runtime's count when it is installed, else the event bus's)."""
    if broker.runs is not None and hasattr(broker.runs, "active_runs"):
        try:
            return len(broker.runs.active_runs())
        except Exception:  # counting must never stop the idle timer; fall back to the bus
            log.debug("active_runs failed", exc_info=True)
    return len(broker.events.active_runs)


def _setup_logging(root: Path, level: int = logging.INFO) -> logging.Handler:
    logs = ensure_private_dir(root / LOG_DIR)
    handler = logging.handlers.RotatingFileHandler(logs / DAEMON_LOG, maxBytes=5 << 20, backupCount=3,
                                                   encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("[relay %(levelname)s] %(message)s"))
    # records logged with extra={"file_only": True} (start-up facts) go to daemon.log only: a user mistake
    # on the command line stays the one line on stderr that it is meant to be
    console.addFilter(lambda record: not getattr(record, "file_only", False))
    top = logging.getLogger("relay_jupyter")
    top.setLevel(level)
    for h in (handler, console):
        top.addHandler(h)
    # tornado's own lines (a malformed request, an uncaught error) go to the same places
    for name in ("tornado.general", "tornado.application"):
        logging.getLogger(name).addHandler(handler)
    return handler


def _state_path() -> Path:
    return state_dir() / f"daemon-{os.getpid()}.json"


def read_states() -> list[dict[str, Any]]:
    """State files of running daemons (stale ones, whose pid is gone, are removed)."""
    out = []
    folder = state_dir()
    for path in sorted(folder.glob("daemon-*.json")) if folder.is_dir() else []:
        try:
            state = json.loads(path.read_text())
            pid = int(state["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not pid_alive(pid):
            try:
                path.unlink()
            except OSError:
                pass
            continue
        out.append({**state, "state_file": str(path)})
    return out


class _Daemon:
    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.stopping = asyncio.Event()
        self.reason = "signal"

    async def run(self) -> int:
        opts = self.options
        # every file the daemon creates (logs, token, state, socket) is private; the user's umask is
        # kept for the files a push creates in the Jupyter root (broker.assembly, workspace/rootfiles)
        user_umask = os.umask(0o077)
        root = ensure_private_dir(Path(opts.config.data_dir)) if opts.config.data_dir else default_data_dir()
        file_handler = _setup_logging(root, opts.log_level)
        if opts.config_files:
            log.info("relay daemon: Jupyter config files read, lowest priority first: %s", ", ".join(opts.config_files),
                     extra={"file_only": True})
        log.debug("relay daemon: log level %s, data dir %s", logging.getLevelName(opts.log_level), root)
        auth_log = AuthLog(root / LOG_DIR / AUTH_LOG)
        # its own audit log (a Jupyter server's broker on the same data dir writes audit.jsonl; both could share
        # one, since an audit log takes several writers, but a file per kind of broker is easier to read)
        config = opts.config.model_copy(update={"data_dir": root, "audit_file": "audit-daemon.jsonl"}) \
            if not opts.config.in_memory else opts.config
        listen = opts.listen
        tokens = None
        if listen.kind == "tcp":
            ensure_token(token_path(root))
            tokens = TokenSource(token_path(root), log=log)
        # kernel credentials: the daemon binds each kernel's origin to the credential it issues (issue 19 item 4)
        kernels = KernelRegistry(root / KERNEL_KEY_FILE, log=log)
        gate = DaemonGate(listen.kind, tokens=tokens, auth_log=auth_log,
                          unauthenticated_metrics=opts.unauthenticated_metrics, kernels=kernels)
        state_file = _state_path()
        bound_path: Path | None = None  # only a socket file we created is ever removed
        broker: Broker | None = None
        server: HTTPServer | None = None
        try:
            # bind first: "already listening" is the clearer message when two daemons race
            if listen.kind == "unix":
                assert listen.path is not None
                socks = [bind_private_unix_socket(listen.path)]
                bound_path = listen.path
                port = None
            else:
                try:
                    socks = bind_sockets(listen.port, address=listen.host, family=socket.AF_UNSPEC)
                except OSError as exc:
                    raise ConfigRefusal(Code.CONFIG_INVALID,
                                        f"cannot listen on {listen.display()}: {exc.strerror}") from None
                port = socks[0].getsockname()[1]
            try:
                broker = Broker.open(config)
            except BaseException:
                for sock in socks:
                    sock.close()
                raise
            # the same parts as inside Jupyter (workspace, runtime + backends or the demo, MCP); the
            # directory the daemon starts in is its Jupyter root (where a push lands)
            install_components(broker, jupyter_root=Path.cwd(), user_umask=user_umask)
            # HTTP MCP servers use the OAuth tokens `jupyter relay mcp-signin` stored (docs/mcp.md, "OAuth sign-in")
            from ..broker.mcp_signin import enable_daemon_mcp_sign_in

            enable_daemon_mcp_sign_in(broker)
            # kept referenced so the task is not collected; a slow MCP server must not delay the start
            self.mcp_start = asyncio.ensure_future(start_components(broker))
            app = make_app(broker, gate, activity=gate, scrub=gate.scrub, relay_kernels=kernels)
            if listen.kind == "unix":
                server = PeerCheckingHTTPServer(app, on_refused=lambda peer: auth_log.event(
                    "refused", "unix", peer, reason="peer_uid"))
            else:  # unauthenticated TCP connections are capped (Slowloris: server/conn_guard.py)
                server = GuardedHTTPServer(app)
            server.add_sockets(socks)
            address = listen.display(port)
            if listen.kind == "tcp" and listen.host not in ("127.0.0.1", "localhost", "::1"):
                log.warning("listening on %s, which is not loopback: the bearer token travels in clear text; "
                            "put a TLS reverse proxy in front", address)
            if opts.unauthenticated_metrics and listen.kind == "tcp":
                log.warning("--unauthenticated-metrics: healthz, readyz and metrics answer without a token "
                            "(anyone who can reach %s can read them)", address)
            ensure_private_dir(state_dir())
            atomic_write_json(state_file, {
                "pid": os.getpid(), "listen": address, "transport": listen.kind, "started_at": time.time(),
                "data_dir": str(root), "idle_timeout": opts.idle_timeout,
                "log_file": str(root / LOG_DIR / DAEMON_LOG), "auth_log": str(root / LOG_DIR / AUTH_LOG),
            })
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop, "signal")
            timers = [PeriodicCallback(broker.prune_events, _PRUNE_EVERY_MS)]
            if tokens is not None:
                timers.append(PeriodicCallback(gate.refresh, 1000))
            if opts.idle_timeout is not None:
                check = min(1.0, max(0.05, opts.idle_timeout / 10))
                timers.append(PeriodicCallback(lambda: self._check_idle(gate, broker), check * 1000))
            for t in timers:
                t.start()
            log.info("relay daemon (pid %d) listening on %s; data in %s", os.getpid(), address, root)
            print(f"relay daemon listening on {address}", flush=True)
            await self.stopping.wait()
            for t in timers:
                t.stop()
            log.info("relay daemon stopping (%s)", self.reason)
        finally:
            await shut_down(server, broker, grace=_SHUTDOWN_GRACE)
            for path in (bound_path, state_file):
                if path is not None:
                    try:
                        path.unlink()
                    except FileNotFoundError:
                        pass
            auth_log.close()
            logging.getLogger("relay_jupyter").removeHandler(file_handler)
            file_handler.close()
        return 0

    def _stop(self, reason: str) -> None:
        self.reason = reason
        self.stopping.set()

    def _check_idle(self, gate: DaemonGate, broker: Broker) -> None:
        timeout = self.options.idle_timeout
        if timeout is None:
            return
        if active_run_count(broker):
            gate.last_activity = time.monotonic()  # the idle clock starts when the last run ends
            return
        if gate.idle_for() >= timeout:
            self._stop(f"idle for {timeout:g} s")


async def serve(options: DaemonOptions) -> int:
    """Run the daemon until SIGTERM/SIGINT or the idle timeout. Returns the exit status."""
    return await _Daemon(options).run()


def run(options: DaemonOptions) -> int:
    """Blocking :func:`serve`."""
    return asyncio.run(serve(options))
