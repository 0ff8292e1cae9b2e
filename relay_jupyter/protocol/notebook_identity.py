"""Which notebook a kernel process runs, as its process tree tells it (issue 19 item 4; docs/daemon.md). The name of a
path is ``client_names.client_name_for`` (re-exported here).

Shared by the kernel (its own guess, sent as a claim) and the standalone daemon, which reads the same facts
about the *peer* process of a Unix-socket connection itself (``SO_PEERCRED`` gives its pid) and binds the
result to the kernel credential it issues: a kernel never names its own origin on the daemon.

The facts, in order:

1. the kernel process's environment as it was started (``/proc/<pid>/environ``): ``RELAY_NOTEBOOK`` (set it
   for a runner that knows the path), ``JPY_SESSION_NAME`` (a Jupyter server, recent VS Code);
2. the command line of the runner that started the kernel (its parent process, ``/proc/<ppid>/cmdline``,
   resolved against the runner's working directory): ``papermill IN OUT``, ``jupyter execute NB``,
   ``jupyter nbconvert --execute NB``, ``pytest --nbval NB``.

Plain standard library (Linux ``/proc``; elsewhere nothing is found and the kernel gets a fresh origin).
"""

from __future__ import annotations

import os
from pathlib import Path

from .client_names import client_name_for

__all__ = ["ANONYMOUS_PREFIX", "ENV_NAMES", "client_name_for", "loopback_peer_pid", "notebook_from_argv",
           "notebook_from_environ", "notebook_of_process", "parent_pid", "runner_notebook"]

#: The environment variables that name a kernel's notebook, first wins.
ENV_NAMES = ("RELAY_NOTEBOOK", "JPY_SESSION_NAME")

#: The name of a kernel whose notebook cannot be known: ``kernel:anon-<12 hex>``, fresh per kernel.
ANONYMOUS_PREFIX = "kernel:anon-"

_MAX_PROC_READ = 1 << 20  # an environment or command line larger than this is not read

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


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_PROC_READ + 1)
    except OSError:
        return None
    return data if len(data) <= _MAX_PROC_READ else None


def runner_notebook(pid: int | None = None) -> str | None:
    """The notebook of the headless runner process ``pid`` (default: this process's parent), from its
    command line and working directory (Linux ``/proc``)."""
    pid = os.getppid() if pid is None else pid
    raw = _read(f"/proc/{pid}/cmdline")
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    if raw is None:
        return None
    argv = [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0") if a]
    return notebook_from_argv(argv, cwd)


def notebook_from_environ(pid: int) -> str | None:
    """``RELAY_NOTEBOOK`` or ``JPY_SESSION_NAME`` from the environment process ``pid`` was started with."""
    raw = _read(f"/proc/{pid}/environ")
    if raw is None:
        return None
    found: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            key = name.decode("ascii", "replace")
            if key in ENV_NAMES and key not in found:
                found[key] = value.decode("utf-8", "surrogateescape").strip()
    for key in ENV_NAMES:
        if found.get(key):
            return found[key]
    return None


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` (``/proc/<pid>/stat``; the command name may hold spaces and ``)``)."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    try:
        return int(raw[raw.rindex(b")") + 2:].split()[1])
    except (ValueError, IndexError):
        return None


def notebook_of_process(pid: int) -> tuple[str | None, str]:
    """``(path, source)`` for the kernel process ``pid``: ``source`` is ``environment`` or ``runner``, or
    ``none`` with path None when the process tree does not say."""
    found = notebook_from_environ(pid)
    if found:
        return found, "environment"
    ppid = parent_pid(pid)
    found = runner_notebook(ppid) if ppid and ppid > 1 else None
    if found:
        return found, "runner"
    return None, "none"


def _proc_net_addr(host: str, port: int) -> str | None:
    """``host:port`` as ``/proc/net/tcp`` writes it (IPv4 loopback only: ``0100007F:1F90``), or None."""
    parts = host.split(".")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        return None
    return "".join(f"{int(p):02X}" for p in reversed(parts)) + f":{port:04X}"


def loopback_peer_pid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The pid of the process of this user holding the other end of a loopback TCP connection whose far end is
    ``peer`` and near end ``local`` (Linux ``/proc/net/tcp`` and ``/proc/<pid>/fd``), or None.

    Written on ``/proc`` rather than with psutil (not a declared dependency): the peer's socket is the row whose
    local address is ``peer`` and remote address ``local``; its inode names the descriptor to look for. A socket
    shared by several processes (a fork) is ambiguous: None. IPv4 only (``127.0.0.1``)."""
    mine, theirs = _proc_net_addr(*peer), _proc_net_addr(*local)
    if mine is None or theirs is None:
        return None
    raw = _read("/proc/net/tcp")
    inode = None
    for line in (raw or b"").decode("ascii", "replace").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[1] == mine and fields[2] == theirs:
            inode = fields[9]
            break
    if not inode or inode == "0":
        return None
    target = f"socket:[{inode}]"
    found: set[int] = set()
    uid = os.geteuid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path) == target:
                        found.add(int(entry.name))
                        break
                except OSError:
                    continue
    return found.pop() if len(found) == 1 else None
