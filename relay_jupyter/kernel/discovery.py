"""Finding the broker from inside a kernel (docs/kernel.md).

In order:

1. ``RELAY_URL`` + ``RELAY_KERNEL_CREDENTIAL``: the kernel was started by a relay-enabled Jupyter
   server; authenticate as ``Authorization: RelayKernel <cred>``.
2. ``RELAY_URL`` alone: a standalone daemon. ``unix://`` needs no header (the daemon checks the
   peer's uid); ``http://`` sends ``Authorization: Bearer <token>`` with the token from
   ``RELAY_TOKEN`` or the 0600 file ``<jupyter data dir>/relay/daemon_token``.
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

from ..protocol.client_names import client_name_for
from ..protocol.local import unix_socket_answers
from .client import Endpoint
from .errors import BrokerUnreachable

__all__ = ["DAEMON_IDLE_TIMEOUT", "client_name_for", "daemon_command", "default_socket_path", "discover",
           "notebook_from_argv", "notebook_path", "runner_notebook"]

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
ANONYMOUS_PREFIX = "kernel:anon-"
_ANONYMOUS = ANONYMOUS_PREFIX + secrets.token_hex(6)


def is_anonymous_client_name(name: str) -> bool:
    """True for the fresh per-kernel name of a kernel that does not know its notebook."""
    return name.startswith(ANONYMOUS_PREFIX)


#: Headless runners whose command line names the notebook they run: the kernel's parent process
#: (jupyter_client starts the kernel from the runner). ``papermill IN OUT``: the input; the others: their one
#: ``.ipynb`` argument (several notebooks in one process are ambiguous: no name).
_RUNNERS = {"papermill": "papermill", "jupyter-execute": "one", "jupyter-nbconvert": "one", "nbconvert": "one",
            "nbclient": "one", "pytest": "one", "py.test": "one"}
#: papermill's options that take values (``-p NAME VALUE`` two), so a value is never taken for the input path.
_PAPERMILL_VALUED = {"-p": 2, "--parameters": 2, "-r": 2, "--parameters_raw": 2, "-f": 1, "--parameters_file": 1,
                     "-y": 1, "--parameters_yaml": 1, "-b": 1, "--parameters_base64": 1, "-k": 1, "--kernel": 1,
                     "-l": 1, "--language": 1, "--engine": 1, "--cwd": 1, "--start-timeout": 1,
                     "--start_timeout": 1, "--execution-timeout": 1, "--log-level": 1, "--stdout-file": 1,
                     "--stderr-file": 1, "--autosave-cell-every": 1}


def notebook_from_argv(argv: list[str], cwd: str) -> str | None:
    """The notebook a runner's command line names, as an absolute path (None: not a runner, or no one notebook).

    ``argv`` is the runner's own command line (``[python,] /path/papermill in.ipynb out.ipynb``, ``python -m
    papermill ...``, ``jupyter-execute a.ipynb``; ``jupyter execute`` execs ``jupyter-execute``), ``cwd`` its
    working directory, against which a relative path is resolved.
    """
    kind = None
    rest: list[str] = []
    for i, arg in enumerate(argv[:3]):  # the program, or the script / -m module the interpreter runs
        name = Path(arg).name.removesuffix(".py") if not argv[i - 1:i] == ["-m"] else arg.split(".")[0]
        if name in _RUNNERS:
            kind, rest = _RUNNERS[name], argv[i + 1:]
            break
    if kind is None:
        return None
    if kind == "papermill":
        found: list[str] = []
        skip = 0
        for arg in rest:
            if skip:
                skip -= 1
            elif arg in _PAPERMILL_VALUED:
                skip = _PAPERMILL_VALUED[arg]
            elif arg == "-" or not arg.startswith("-"):  # "-": the notebook on stdin
                found.append(arg)
        path = found[0] if found else None
    else:
        candidates = [a for a in rest if a.endswith(".ipynb") and not a.startswith("-")]
        path = candidates[0] if len(candidates) == 1 else None
    if not path or not path.endswith(".ipynb") or "://" in path:
        return None  # stdin ("-"), a URL (s3://...), not a notebook file
    return os.path.normpath(os.path.join(cwd, path))


def runner_notebook(pid: int | None = None) -> str | None:
    """The notebook the headless runner that started this kernel runs, from its command line (Linux ``/proc``)."""
    pid = os.getppid() if pid is None else pid
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    argv = [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0") if a]
    return notebook_from_argv(argv, cwd)


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


async def discover(*, client_name: str = "kernel", start_daemon: bool = True, wait: float = 60.0) -> Endpoint:
    """The broker endpoint for this kernel (see the module docstring for the order).

    Raises:
        BrokerUnreachable: nothing configured, no daemon running and ``start_daemon`` is false or failed.
    """
    url = os.environ.get("RELAY_URL", "").strip()
    credential = os.environ.get("RELAY_KERNEL_CREDENTIAL", "").strip()
    if url:
        if credential:
            return Endpoint(url, f"RelayKernel {credential}", client_name)
        if url.startswith("unix:"):
            return Endpoint(url, None, client_name)
        token = _daemon_token()
        return Endpoint(url, f"Bearer {token}" if token else None, client_name)
    path = default_socket_path()
    if not unix_socket_answers(path):
        if not start_daemon:
            raise BrokerUnreachable(
                f"no relay broker: RELAY_URL is not set and no daemon listens on {path}; start Jupyter with the "
                "relay extension or run `jupyter relay serve`")
        await _start_daemon(path, wait)
    return Endpoint(f"unix://{path}", None, client_name)
