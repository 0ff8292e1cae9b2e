"""Finding the broker from inside a kernel (docs/kernel.md).

In order:

1. ``RELAY_URL`` + ``RELAY_KERNEL_CREDENTIAL``: the kernel was started by a relay-enabled Jupyter
   server; authenticate as ``Authorization: RelayKernel <cred>``.
2. ``RELAY_URL`` alone: a standalone daemon. ``unix://`` needs no header (the daemon checks the
   peer's uid); ``http://`` sends ``Authorization: Bearer <token>`` with the token from
   ``RELAY_TOKEN`` or the 0600 file ``<jupyter data dir>/relay/daemon_token``. The kernel then
   registers (``POST /relay/kernel``, :func:`register`) and sends the daemon's credential as
   ``X-Relay-Kernel``: the daemon, not the kernel, decides which notebook's origin it is.
3. Nothing set: the user's shared daemon on ``unix://<jupyter runtime dir>/relay/relay.sock``;
   if no daemon answers there, start one detached (``jupyter relay serve --listen unix://...
   --idle-timeout 600``) and wait for its socket while it runs (at most 60 s: on a loaded machine the
   daemon's imports alone took more than 10 s, and the first cell failed while it was starting).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..protocol.client_names import anonymous_name_for, client_name_for, kernel_instance
from ..protocol import notebook_identity
from ..protocol.local import unix_socket_answers
from ..protocol.notebook_identity import notebook_from_argv, runner_notebook
from .client import Endpoint
from .errors import BrokerUnreachable

__all__ = ["DAEMON_IDLE_TIMEOUT", "client_name_for", "daemon_command", "default_socket_path", "discover",
           "notebook_from_argv", "notebook_path", "register", "renewed_auth", "runner_notebook"]

DAEMON_IDLE_TIMEOUT = 600


def default_socket_path() -> Path:
    """``<jupyter runtime dir>/relay/relay.sock`` (``JUPYTER_RUNTIME_DIR`` moves it)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "relay" / "relay.sock"


def _daemon_token() -> str | None:
    token = os.environ.get("RELAY_TOKEN")
    if token:
        return token.strip()
    from jupyter_core.paths import jupyter_data_dir

    path = Path(jupyter_data_dir()) / "relay" / "daemon_token"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def daemon_command(socket_path: Path) -> list[str]:
    """The command that starts the user's shared daemon (``jupyter relay serve``), run with this Python."""
    return [sys.executable, "-m", "relay_jupyter.cli", "serve", "--listen", f"unix://{socket_path}",
            "--idle-timeout", str(DAEMON_IDLE_TIMEOUT)]


def _spawn_daemon(path: Path, log: Path) -> subprocess.Popen[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    with open(log, "ab") as sink:
        # detached: own session, so it outlives this kernel and is shared by the user's kernels
        return subprocess.Popen(daemon_command(path), stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                start_new_session=True, close_fds=True)


async def _start_daemon(path: Path, wait: float) -> None:
    log = path.parent / "daemon.log"
    process = _spawn_daemon(path, log)  # a fork+exec: quick, not worth a thread
    deadline = asyncio.get_running_loop().time() + wait
    while asyncio.get_running_loop().time() < deadline:
        if unix_socket_answers(path):
            return
        if process.poll() is not None:
            break
        await asyncio.sleep(0.05)  # polling a socket file that another process creates; no event to await
    raise BrokerUnreachable(
        f"no relay broker found and starting one failed (see {log}); run this kernel from a Jupyter server with "
        "the relay extension, or set RELAY_URL")


#: The name of a kernel that cannot know its notebook (nbclient, papermill, terminal IPython): fresh per
#: kernel process, so one headless notebook's grant and budget never apply to another (issue 19 item 4).
ANONYMOUS_PREFIX = notebook_identity.ANONYMOUS_PREFIX
_ANONYMOUS = ANONYMOUS_PREFIX + secrets.token_hex(6)
if (_instance := kernel_instance(os.environ)) is not None:  # a hub's thin server named this kernel: it can end it
    _ANONYMOUS = anonymous_name_for(_instance)


def is_anonymous_client_name(name: str) -> bool:
    """True for the fresh per-kernel name of a kernel that does not know its notebook."""
    return name.startswith(ANONYMOUS_PREFIX)


def notebook_path(user_ns: dict[str, Any] | None = None) -> str | None:
    """The notebook this kernel runs, wherever the runner tells it (None: nobody does).

    In order: ``RELAY_NOTEBOOK`` (set it for a runner that knows the path), ``JPY_SESSION_NAME`` (a Jupyter
    server sets it for a notebook's kernel), VS Code's ``__vsc_ipynb_file__`` in the user namespace, and the
    command line of the runner that started the kernel (:func:`runner_notebook`: ``papermill IN OUT``,
    ``jupyter execute NB``, ``jupyter nbconvert --execute NB``, ``pytest --nbval NB``). nbclient or papermill
    called as a library from a script tell the kernel nothing: set ``RELAY_NOTEBOOK`` before each call.
    """
    raw = os.environ.get("RELAY_NOTEBOOK", "").strip() or os.environ.get("JPY_SESSION_NAME", "").strip()
    if not raw and user_ns is not None:
        value = user_ns.get("__vsc_ipynb_file__")
        raw = value.strip() if isinstance(value, str) else ""
    return raw or runner_notebook()


def notebook_client_name(user_ns: dict[str, Any] | None = None) -> str:
    """``X-Relay-Client`` for this kernel: ``kernel:<notebook>`` (:func:`notebook_path`,
    :func:`client_name_for`) so each notebook attached to the standalone daemon gets its own origin
    (``daemon:kernel:<notebook>``) and grants. Without a path, the kernel gets a fresh name of its own
    (``kernel:anon-<12 hex>``, :data:`ANONYMOUS_PREFIX`): two headless notebooks never share an origin,
    a grant or a budget.
    """
    raw = notebook_path(user_ns)
    return client_name_for(raw) if raw else _ANONYMOUS


async def register(endpoint: Endpoint, notebook: str | None, *, timeout: float = 10.0) -> Endpoint:
    """``endpoint`` with the daemon's credential for this kernel (``POST /relay/kernel``; docs/daemon.md).

    The daemon derives the origin itself and binds it to the credential; ``notebook`` (this kernel's own
    guess, :func:`notebook_path`) is sent as ``X-Relay-Notebook`` and counts only where the daemon cannot see
    the kernel's process (TCP). A broker without the endpoint (the hub service, an older daemon: 404) keeps
    ``endpoint`` as it is.

    Raises:
        BrokerUnreachable / AgentError: the broker is unreachable or refused the kernel (401).
    """
    import json
    from urllib.parse import quote

    from .client import RelayClient, _status_error

    client = RelayClient(Endpoint(endpoint.url, endpoint.auth, "kernel"), rpc_timeout=timeout)
    headers = {"X-Relay-Notebook": quote(notebook, safe="/")} if notebook else {}
    try:
        async with asyncio.timeout(timeout):
            response = await client._request("POST", "kernel", b"", headers=headers)
            try:
                raw = await response.body(limit=64 * 1024)
            finally:
                response.close()
    except (TimeoutError, OSError, asyncio.IncompleteReadError):
        raise BrokerUnreachable(f"the relay daemon at {endpoint.display} did not register this kernel") from None
    if response.status == 404:
        return endpoint
    try:
        answer = json.loads(raw) if response.status == 200 else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("credential"), str) \
            or not str(answer.get("origin", "")).startswith("daemon:kernel:"):
        raise _status_error(response.status if response.status != 200 else 502, raw, "kernel registration")
    return Endpoint(endpoint.url, endpoint.auth, str(answer["origin"]).removeprefix("daemon:"),
                    kernel_credential=answer["credential"], notebook_claim=notebook)


def renewed_auth(endpoint: Endpoint) -> str | None:
    """The ``Authorization`` of ``endpoint`` read again from where it came from: on TCP the bearer token of
    ``RELAY_TOKEN`` or the daemon's token file (``jupyter relay token rotate`` replaces the file); on the Unix socket
    none (peer credentials)."""
    if endpoint.auth is None or not endpoint.auth.startswith("Bearer "):
        return endpoint.auth
    token = _daemon_token()
    return f"Bearer {token}" if token else endpoint.auth


async def discover(*, client_name: str = "kernel", start_daemon: bool = True, wait: float = 60.0,
                   notebook: str | None = None) -> Endpoint:
    """The broker endpoint for this kernel (see the module docstring for the order).

    On a standalone daemon a kernel named ``kernel:...`` (the default: :func:`notebook_client_name`) registers
    (:func:`register`, with ``notebook`` as its claim): its origin is then the one the daemon bound to its
    credential, not the name. Any other name (``%config AgentMagics.client_name``) is a daemon client's label.

    Raises:
        BrokerUnreachable: nothing configured, no daemon running and ``start_daemon`` is false or failed.
    """
    url = os.environ.get("RELAY_URL", "").strip()
    credential = os.environ.get("RELAY_KERNEL_CREDENTIAL", "").strip()
    if url:
        if credential:
            return Endpoint(url, f"RelayKernel {credential}", client_name)
        if url.startswith("unix:"):
            found = Endpoint(url, None, client_name)
        else:
            token = _daemon_token()
            found = Endpoint(url, f"Bearer {token}" if token else None, client_name)
    else:
        path = default_socket_path()
        if not unix_socket_answers(path):
            if not start_daemon:
                raise BrokerUnreachable(
                    f"no relay broker: RELAY_URL is not set and no daemon listens on {path}; start Jupyter with "
                    "the relay extension or run `jupyter relay serve`")
            await _start_daemon(path, wait)
        found = Endpoint(f"unix://{path}", None, client_name)
    if client_name.startswith("kernel:"):
        return await register(found, notebook)
    return found
