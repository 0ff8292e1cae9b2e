"""A private relay broker for one notebook: what the documentation notebooks start when they run
outside a relay-enabled Jupyter server (nbval, nbclient, CI), or when they need a broker configured
differently from the server's (an MCP server, a local model).

    from relay_jupyter.notebook_broker import NotebookBroker

    broker = NotebookBroker.for_notebook("quickstart")       # a no-op inside relay-enabled Jupyter
    broker = NotebookBroker(mcp_servers={"time": {...}}).start()  # always its own daemon
    ...
    broker.stop()                                            # last cell: stop it, delete its files

Started, it runs ``jupyter relay serve`` (the standalone daemon: the broker stays out of the
kernel process) on a Unix socket in a fresh private temporary folder that also holds its data
dir, its Jupyter config/runtime dirs and a ``project`` folder (its Jupyter root: where a push
lands), and points this kernel at it (``RELAY_URL``; a server-given credential is set aside and
restored by :meth:`stop`). Model keys are not passed on unless ``keep_keys`` is set, so the demo
backend answers and the notebook's outputs are the same on every machine.

It is not a test double (it runs the real daemon), so it lives here rather than in ``relay_jupyter.testing``:
no user-facing notebook cell imports the test package unless it needs a fake (issue 13).
``relay_jupyter.testing.demo_broker`` re-exports it for older code.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from .protocol.local import unix_socket_answers

__all__ = ["MODEL_KEY_VARS", "NotebookBroker", "ToolsNotOffered", "headless"]

#: Environment variables holding model keys; not handed to a private daemon unless ``keep_keys``.
MODEL_KEY_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "RELAY_ANTHROPIC_API_KEY",
                  "RELAY_OPENAI_API_KEY")
_KERNEL_VARS = ("RELAY_URL", "RELAY_KERNEL_CREDENTIAL", "RELAY_TOKEN")
_START_TIMEOUT = 30.0
_IDLE_TIMEOUT = 1800  # a safety net: a daemon whose kernel died without stop() exits by itself


#: The daemon's per-request access logger: left out of :meth:`NotebookBroker.log_tail` by default.
_ACCESS_LOGGER = "relay_jupyter.daemon.access"


class ToolsNotOffered(TimeoutError):
    """:meth:`NotebookBroker.wait_for_tools` gave up. Shown as one line in a notebook (no traceback)."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mrelay:\x1b[0m {' '.join(str(self).split())}"]


def headless() -> bool:
    """True when nobody can click in this cell (nbval, nbclient, papermill, CI): the same test the
    ``%%agent`` consent uses (``relay_jupyter.kernel.consent.detect_surface``)."""
    from IPython import get_ipython

    from .kernel.consent import detect_surface

    return detect_surface(get_ipython()) == "headless"


class NotebookBroker:
    """A standalone relay daemon owned by one notebook (see the module docstring).

    ``config``: extra broker settings (the ``c.RelayApp.*`` names, e.g. ``openai_base_url``,
    ``default_backend``, ``default_model``, ``consent_timeout``). ``mcp_servers``: the
    ``mcpServers`` object of an ``mcp.json`` written into the private config dir.
    """

    def __init__(self, *, config: dict[str, Any] | None = None, mcp_servers: dict[str, Any] | None = None,
                 keep_keys: bool = False, prefix: str = "relay-nb-") -> None:
        self.config = dict(config or {})
        self.mcp_servers = mcp_servers
        self.keep_keys = keep_keys
        self.prefix = prefix
        self.folder: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._saved_env: dict[str, str | None] = {}

    # -- choosing ---------------------------------------------------------------------------------

    @classmethod
    def for_notebook(cls, name: str = "notebook", **kwargs: Any) -> NotebookBroker:
        """Use the broker of the relay-enabled Jupyter server this kernel runs in (or the daemon
        ``RELAY_URL`` names); otherwise start a private one. Prints which, in one line."""
        broker = cls(prefix=f"relay-{name}-"[:40], **kwargs)
        if os.environ.get("RELAY_KERNEL_CREDENTIAL") or os.environ.get("RELAY_URL"):
            where = "this Jupyter server" if os.environ.get("RELAY_KERNEL_CREDENTIAL") else "RELAY_URL"
            print(f"relay: using the broker of {where}")
            return broker
        broker.start()
        print("relay: no relay-enabled Jupyter server here; started a private broker for this notebook "
              "(stopped by its last cell)")
        return broker

    # -- paths ------------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """True while this object's daemon runs."""
        return self.process is not None and self.process.poll() is None

    def _path(self, *parts: str) -> Path:
        if self.folder is None:
            raise RuntimeError("this NotebookBroker was not started")
        return self.folder.joinpath(*parts)

    @property
    def socket_path(self) -> Path:
        return self._path("run", "relay.sock")

    @property
    def data_dir(self) -> Path:
        """The broker's data dir (store, audit log, daemon log)."""
        return self._path("data")

    @property
    def project(self) -> Path:
        """The daemon's Jupyter root: ``scratch_push`` writes here."""
        return self._path("project")

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def log_tail(self, lines: int = 40, *, access: bool = False) -> str:
        """The end of the daemon's log (what it printed, and its log file): relay's own messages; the
        per-request access lines (``relay_jupyter.daemon.access``, mostly this object's own polling) only
        with ``access=True``."""
        out = []
        for path in (self._path("daemon.out"), self.data_dir / "logs" / "daemon.log"):
            try:
                found = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            out += [line for line in found if access or _ACCESS_LOGGER not in line][-lines:]
        return "\n".join(out[-lines:])

    def _unavailable(self, servers: set[str]) -> str | None:
        """The daemon's one-line reason why one of ``servers`` could not be connected, if it logged one."""
        for line in reversed(self.log_tail(400).splitlines()):
            for server in servers:
                marker = f"MCP server '{server}' unavailable: "
                if marker in line:
                    return line[line.index(marker):][:600]
        return None

    # -- lifecycle --------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _KERNEL_VARS}
        if not self.keep_keys:
            for name in MODEL_KEY_VARS:
                env.pop(name, None)
        env.update(JUPYTER_CONFIG_DIR=str(self._path("config")), JUPYTER_RUNTIME_DIR=str(self._path("runtime")),
                   JUPYTER_DATA_DIR=str(self._path("jupyter-data")))
        return env

    def command(self) -> list[str]:
        """``jupyter relay serve`` with this broker's socket, data dir and settings."""
        return [sys.executable, "-m", "relay_jupyter.cli", "serve", "--listen", self.url,
                "--data-dir", str(self.data_dir), "--config", str(self._path("config", "broker.json")),
                "--idle-timeout", str(_IDLE_TIMEOUT)]

    def start(self) -> NotebookBroker:
        """Start the daemon, wait for its socket, point this kernel at it. Returns self.

        Raises:
            RuntimeError: the daemon did not come up (its log tail is in the message).
        """
        if self.started:
            return self
        # short prefix under the system temp dir: a Unix socket path must stay under ~100 bytes
        self.folder = Path(tempfile.mkdtemp(prefix=self.prefix))
        for sub in ("run", "config", "runtime", "jupyter-data", "project"):
            self._path(sub).mkdir(mode=0o700)
        settings = dict(self.config)
        if self.mcp_servers is not None:
            mcp = self._path("config", "mcp.json")
            mcp.write_text(json.dumps({"mcpServers": self.mcp_servers}, indent=2))
            settings.setdefault("mcp_config_path", str(mcp))
        self._path("config", "broker.json").write_text(json.dumps(settings))
        with open(self._path("daemon.out"), "wb") as sink:
            self.process = subprocess.Popen(self.command(), cwd=self.project, env=self._env(),
                                            stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                            start_new_session=True)
        atexit.register(self.stop)
        deadline = time.monotonic() + _START_TIMEOUT
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"the private relay broker did not start:\n{tail}")
            time.sleep(0.05)  # waiting for another process to create its socket: no event to await
        for name in _KERNEL_VARS:
            self._saved_env[name] = os.environ.pop(name, None)
        os.environ["RELAY_URL"] = self.url
        return self

    def rpc(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """One JSON-RPC call to this daemon as this notebook's kernel (``X-Relay-Client: kernel``).

        Raises:
            RuntimeError: the daemon answered with a JSON-RPC error.
        """
        import http.client

        class _Unix(http.client.HTTPConnection):  # http.client over a Unix socket (not in the stdlib)
            def connect(conn) -> None:
                conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.sock.settimeout(timeout)
                conn.sock.connect(str(self.socket_path))

        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})
        conn = _Unix("localhost", timeout=timeout)
        try:
            conn.request("POST", "/relay/rpc", body, {"Content-Type": "application/json", "X-Relay-Client": "kernel"})
            reply = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result")

    def wait_for_tools(self, *names: str, timeout: float = 30.0) -> list[str]:
        """Wait until the broker offers every tool in ``names`` (MCP servers connect in the background
        after the daemon starts). Returns the names of all tools offered.

        Raises:
            ToolsNotOffered: naming the tools still missing, at once when the daemon logged that their MCP
                server could not start (with its reason); a one-line error in a notebook.
        """
        deadline = time.monotonic() + timeout
        servers = {n.split("__", 1)[0] for n in names if "__" in n}
        while True:
            offered = [t.get("name") for t in (self.rpc("tools.list") or {}).get("tools", [])]
            missing = [n for n in names if n not in offered]
            if not missing:
                return offered
            reason = self._unavailable(servers)
            if reason is not None:
                raise ToolsNotOffered(f"the broker does not offer {', '.join(missing)}: {reason}")
            if time.monotonic() > deadline:
                raise ToolsNotOffered(f"the broker does not offer {', '.join(missing)} after {timeout:.0f} s; "
                                      "see broker.log_tail()")
            time.sleep(0.2)  # the MCP server is starting in another process: nothing to await here

    def _answers(self) -> bool:
        return unix_socket_answers(self.socket_path)

    def stop(self) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL after 10 s), restore this kernel's environment and
        delete the temporary folder. Safe to call twice, and a no-op when nothing was started."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if self._saved_env:
            if os.environ.get("RELAY_URL") == (self.url if self.folder else None):
                os.environ.pop("RELAY_URL", None)
            for name, value in self._saved_env.items():
                if value is not None:
                    os.environ[name] = value
            self._saved_env = {}
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.url}" if self.started else "not started"
        return f"<NotebookBroker {state}>"
