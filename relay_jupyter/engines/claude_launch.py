"""The launcher between claude-agent-sdk and the ``claude`` CLI (stdlib only; run as ``python -I -S``).

The SDK starts its CLI with the *broker's* environment merged under ``options.env``. The claude-code
engine wants an environment built from nothing (no model keys, no Jupyter token, no broker settings), and
the CLI and every process it starts kept together, so that a cancel — or the broker's death — ends all of
them. So the engine gives the SDK, as ``cli_path``, a 0700 script that runs this file, which:

1. ``setsid()``: a new session and process group, whose id (this pid) it records in ``<run dir>/pid``;
2. becomes a **child subreaper** (``PR_SET_CHILD_SUBREAPER``): every process the CLI starts and leaves
   behind — a ``Bash`` command's background child, one that started a session of its own, a double fork
   — is re-parented to this launcher instead of to init, so the tree under it stays whole;
3. forks the real CLI, in a process group of its own, with exactly the environment in ``<run dir>/env.json``
   plus the few protocol variables the SDK sets for its CLI (:data:`SDK_VARIABLES`), nothing else of the
   broker's;
4. waits for the CLI's end, the SDK's SIGTERM (its close), SIGINT / SIGHUP — and looks every
   :data:`POLL_SECONDS` whether the broker still lives (a SIGKILLed broker runs no code and sends nothing;
   ``PR_SET_PDEATHSIG`` is not used: it fires when the broker's *thread* that started the launcher ends,
   which is not the broker's death);
5. then SIGKILLs every descendant, reaps them and exits with the CLI's status. When the broker is gone it
   also removes the run directory, which the engine would have.

Hand-written rather than a library: nothing on PyPI does "subreaper + watch the parent + kill the tree"
without extra dependencies, and this must run with ``-I -S`` (no site-packages).

usage: python -I -S claude_launch.py <run dir> <cli> [cli arguments...]
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import sys
import time

#: Variables the SDK sets for its CLI (the stream-json protocol and its session-state frames).
SDK_VARIABLES = ("CLAUDE_CODE_ENTRYPOINT", "CLAUDE_AGENT_SDK_VERSION", "CLAUDE_CODE_SDK_READS_SESSION_STATE",
                 "CLAUDE_AGENT_SDK_CLIENT_APP", "CLAUDE_CODE_ENABLE_SDK_FILE_CHECKPOINTING", "PWD")

PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Live descendants of ``root`` (by parent links in /proc; orphans of the tree are re-parented to
    ``root``, the subreaper, so the links stay whole)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            out.append(child)
            stack.append(child)
    return out


def kill_tree() -> None:
    """SIGKILL every descendant of this process and reap them (looking again while any forks)."""
    me = os.getpid()
    for _ in range(20):
        pids = descendants(me)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reaped(-1)
        time.sleep(0.01)
    _reaped(-1)


def main(argv: list[str]) -> None:
    run_dir, cli, *args = argv
    with open(os.path.join(run_dir, "env.json"), encoding="utf-8") as f:
        env = {str(k): str(v) for k, v in json.load(f).items()}
    for name in SDK_VARIABLES:
        if name in os.environ and name not in env:
            env[name] = os.environ[name]
    parent = os.getppid()
    os.setsid()
    fd = os.open(os.path.join(run_dir, "pid"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    # signals are taken synchronously (sigtimedwait), never by handlers: no race with the wait below
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
    cli_pid = os.fork()
    if cli_pid == 0:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, ())  # the CLI gets the default mask back
            # a process group of its own (same session): a CLI that kills its group on exit must not take
            # this launcher with it before it has cleaned up
            os.setpgid(0, 0)
            os.execve(cli, [cli, *args], env)
        finally:
            os._exit(127)
    # the CLI holds the SDK's pipes; this process lets go of its copies, so they close with the CLI
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    stopped, code, orphaned = 0, 1, False
    while True:
        info = signal.sigtimedwait(_WATCHED, POLL_SECONDS)
        if os.getppid() != parent:  # the broker is gone (a SIGKILL runs no code of its own): clean up
            orphaned = True
            break
        if info is None:
            continue
        if info.si_signo != signal.SIGCHLD:  # the SDK closing (SIGTERM), or an interrupt
            stopped = info.si_signo
            break
        status = _reaped(cli_pid)
        if status is not None:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            break
    kill_tree()
    if orphaned or os.getppid() != parent:
        shutil.rmtree(run_dir, ignore_errors=True)  # nobody else will remove it now
    os._exit(128 + stopped if stopped else code)


#: What the launcher waits for: a child's end, the SDK's terminate, an interrupt or hang-up.
_WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
#: How often the launcher looks whether its broker still lives (a broker's SIGKILL sends it nothing).
POLL_SECONDS = 0.5


def _reaped(cli_pid: int) -> int | None:
    """Reap every exited child; the wait status of ``cli_pid`` when it was among them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == cli_pid:
            found = status


if __name__ == "__main__":
    main(sys.argv[1:])
