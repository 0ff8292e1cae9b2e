"""What the ``jupyter relay`` CLI finds of the broker inside a Jupyter server (issue 13 item 7; docs/daemon.md).

A Jupyter server's own ``jpserver-<pid>.json`` says where the server listens, not where relay keeps its data or
its log. So the extension, once its broker is open, also writes:

- ``<data dir>/logs/jupyter-server-<pid>.log`` (rotated like the daemon's ``daemon.log``): relay's log lines
  at the server's level, besides the server's own output, which ``jupyter relay logs`` tails;
- ``<jupyter runtime dir>/relay/jpserver-relay-<pid>.json`` (0600): ``{pid, url, data_dir, log_file}``, removed
  at exit and ignored once its pid is gone (as the daemon's ``daemon-<pid>.json``).

Nothing secret is in either: no token, no key.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import os
import time
from pathlib import Path
from typing import Any

from ..storage.atomic import atomic_write_json
from ..storage.paths import ensure_private_dir, runtime_dir

__all__ = ["STATE_PREFIX", "pid_alive", "publish", "server_log_name", "server_states"]

STATE_PREFIX = "jpserver-relay-"


def server_log_name(pid: int) -> str:
    return f"jupyter-server-{pid}.log"


def _state_dir() -> Path:
    return runtime_dir() / "relay"


def publish(data_dir: Path, url: str, level: int) -> Path:
    """Add the log file to relay's logger and write the state file; both are undone at exit. Returns the log."""
    logs = ensure_private_dir(Path(data_dir) / "logs")
    path = logs / server_log_name(os.getpid())
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=5 << 20, backupCount=3, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(level)
    relay_log = logging.getLogger("relay_jupyter")
    relay_log.addHandler(handler)
    state = ensure_private_dir(_state_dir()) / f"{STATE_PREFIX}{os.getpid()}.json"
    atomic_write_json(state, {"pid": os.getpid(), "url": url, "data_dir": str(data_dir), "log_file": str(path),
                              "started_at": time.time()})

    def _unpublish() -> None:
        relay_log.removeHandler(handler)
        handler.close()
        try:
            state.unlink()
        except OSError:
            pass

    atexit.register(_unpublish)
    # the file's first line, as the daemon's "listening on": whose broker this is, where its data is
    logging.getLogger("relay_jupyter.server").info("relay broker of the Jupyter server at %s (pid %d); data in %s",
                                                   url, os.getpid(), data_dir)
    return path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one that another user owns counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def server_states() -> list[dict[str, Any]]:
    """The state files of this user's running Jupyter servers with a relay broker (stale ones are skipped)."""
    folder = _state_dir()
    out = []
    for path in sorted(folder.glob(f"{STATE_PREFIX}*.json")) if folder.is_dir() else []:
        try:
            state = json.loads(path.read_text())
            pid = int(state["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid_alive(pid):
            out.append({**state, "state_file": str(path)})
    return out
