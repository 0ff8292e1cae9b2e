"""``jupyter relay status | stop | logs``: the standalone daemons of this user (``status`` and ``logs``: and the
broker inside each running Jupyter server with the extension).

They find daemons through the state files in ``<jupyter runtime dir>/relay/daemon-<pid>.json``
(written by ``jupyter relay serve``) and talk to each over its own socket: ``healthz``, ``readyz``
and ``metrics`` (with the bearer token from the daemon's data dir on TCP).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.errors import Code, ConfigRefusal, RoutingRefusal
from ..protocol.local import UnixHTTPConnection
from ..storage.paths import data_dir

__all__ = ["probe", "register"]


def register(subparsers: Any) -> None:
    """Add ``status``, ``stop`` and ``logs`` to ``jupyter relay``."""
    s = subparsers.add_parser("status", help="running daemons: address, pid, uptime, readiness, active runs")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_cmd_status)
    t = subparsers.add_parser("stop", help="stop running daemons (SIGTERM, then wait)")
    t.add_argument("--pid", type=int, help="stop only this daemon (default: every daemon of this user)")
    t.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each to exit (default 10)")
    t.set_defaults(func=_cmd_stop)
    g = subparsers.add_parser("logs", help="the tail of each running broker's log: daemons and Jupyter servers (or "
                                           "of a daemon's auth log)")
    g.add_argument("--auth", action="store_true", help="the auth log (logs/auth.jsonl) instead")
    g.add_argument("-n", "--lines", type=int, default=50, help="how many lines (default 50)")
    g.add_argument("--data-dir", metavar="PATH",
                   help="a daemon's data dir (default: every running broker's log, else <jupyter data dir>/relay)")
    g.set_defaults(func=_cmd_logs)


def _get(state: dict[str, Any], endpoint: str, timeout: float = 3.0) -> tuple[int, bytes]:
    from ..server.daemon_auth import read_token, token_path  # tornado and the broker's core: only when used

    parts = urlsplit(state["listen"])
    headers = {"X-Relay-Client": "cli"}
    conn: http.client.HTTPConnection
    if parts.scheme == "unix":
        conn = UnixHTTPConnection(parts.path, timeout)
    else:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
        token = read_token(token_path(Path(state["data_dir"])))
        if token:
            headers["Authorization"] = "Bearer " + token.decode("ascii")
    try:
        conn.request("GET", f"/relay/{endpoint}", headers=headers)
        response = conn.getresponse()
        return response.status, response.read(1 << 20)
    finally:
        conn.close()


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def probe(state: dict[str, Any]) -> dict[str, Any]:
    """What one daemon says about itself: ``{healthy, ready, active_runs, error}``."""
    out: dict[str, Any] = {"healthy": False, "ready": False, "active_runs": None, "error": None}
    try:
        status, _ = _get(state, "healthz")
        out["healthy"] = status == 200
        if status != 200:
            out["error"] = f"healthz answered HTTP {status}"
            return out
        status, _ = _get(state, "readyz")
        out["ready"] = status == 200
        status, body = _get(state, "metrics")
        if status == 200:
            runs = _metric(body.decode("utf-8", "replace"), "relay_active_runs")
            out["active_runs"] = None if runs is None else int(runs)
    except (OSError, http.client.HTTPException, ConfigRefusal) as exc:
        out["error"] = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return out


def server_probes() -> list[dict[str, Any]]:
    """The relay brokers inside this user's running Jupyter servers (``jpserver-*.json``, as ``jupyter relay kill``
    finds them): ``{url, pid, healthy, ready, active_runs, error}`` each; a server without the extension (HTTP 404
    on ``relay/readyz``) is left out. The token is sent only to a loopback address, never through a proxy."""
    import urllib.error
    import urllib.request

    from ..core.netaddr import is_loopback_host
    from .kill import _servers

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    rows = []
    for info in _servers():
        url = str(info["url"])
        row: dict[str, Any] = {"url": url, "pid": info.get("pid"), "healthy": False, "ready": False,
                               "active_runs": None, "error": None}
        if not is_loopback_host(urlsplit(url).hostname or ""):
            row["error"] = "not a loopback address; see that server's side panel"
            rows.append(row)
            continue
        headers = {"Authorization": f"token {info.get('token') or ''}"}
        try:
            for endpoint in ("readyz", "metrics"):
                request = urllib.request.Request(url.rstrip("/") + "/relay/" + endpoint, headers=headers)
                try:
                    with opener.open(request, timeout=3.0) as response:
                        body = response.read(1 << 20)
                        status = response.status
                except urllib.error.HTTPError as exc:
                    status, body = exc.code, b""
                if endpoint == "readyz":
                    if status == 404:
                        row = {}  # no relay extension in this server
                        break
                    row["healthy"], row["ready"] = status in (200, 503), status == 200
                elif status == 200:
                    runs = _metric(body.decode("utf-8", "replace"), "relay_active_runs")
                    row["active_runs"] = None if runs is None else int(runs)
        except OSError as exc:
            row["error"] = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
        if row:
            rows.append(row)
    return rows


def _uptime(seconds: float) -> str:
    seconds = int(max(0, seconds))
    d, rem = divmod(seconds, 86_400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return (f"{d}d" if d else "") + (f"{h}h" if h or d else "") + f"{m}m{s:02d}s"


def _cmd_status(args: argparse.Namespace) -> int:
    from ..server.daemon import read_states  # server.daemon imports the broker: only when used

    states = read_states()
    rows = []
    for state in states:
        info = probe(state)
        rows.append({"pid": state["pid"], "listen": state["listen"], "uptime_s": time.time() - state["started_at"],
                     "data_dir": state["data_dir"], **info})
    servers = server_probes()  # the broker inside each running Jupyter server with the extension (issue 13)
    if args.json:
        print(json.dumps({"daemons": rows, "jupyter_servers": servers}, indent=2))
        return 0 if rows or servers else 1
    for r in servers:
        state = "ready" if r["ready"] else ("not ready" if r["healthy"] else f"unreachable: {r['error']}")
        runs = "?" if r["active_runs"] is None else r["active_runs"]
        print(f"jupyter server {r['url']}  pid {r['pid']}  {state}  active runs {runs}")
    if not rows and not servers:
        print("no relay daemon is running (start one with `jupyter relay serve`)")
        return 1
    for r in rows:
        state = "ready" if r["ready"] else ("not ready" if r["healthy"] else f"unreachable: {r['error']}")
        runs = "?" if r["active_runs"] is None else r["active_runs"]
        print(f"{r['listen']}  pid {r['pid']}  up {_uptime(r['uptime_s'])}  {state}  active runs {runs}  "
              f"data {r['data_dir']}")
    return 0


def _is_our_daemon(pid: int) -> bool:
    """On Linux, check the pid still runs ``relay ... serve`` (a reused pid is never signalled)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\x00")
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs: trust the state file
    except OSError:
        return False
    return b"serve" in cmdline and any(b"relay" in part for part in cmdline)


def _exited(pid: int, state_file: str) -> bool:
    if not Path(state_file).exists():
        return True  # the daemon removes it as the last step of a clean stop
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _cmd_stop(args: argparse.Namespace) -> int:
    from ..server.daemon import read_states  # server.daemon imports the broker: only when used

    states = read_states()
    if args.pid is not None:
        states = [s for s in states if int(s["pid"]) == args.pid]
        if not states:
            raise RoutingRefusal(Code.NOT_FOUND, f"no relay daemon with pid {args.pid} is running")
    if not states:
        print("no relay daemon is running")
        return 0
    status = 0
    for state in states:
        pid = int(state["pid"])
        if not _is_our_daemon(pid):
            print(f"pid {pid} is no longer a relay daemon; removing its stale state file", file=sys.stderr)
            Path(state["state_file"]).unlink(missing_ok=True)
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + args.timeout
        while not _exited(pid, state["state_file"]):
            if time.monotonic() > deadline:
                print(f"relay daemon pid {pid} did not stop within {args.timeout:g} s", file=sys.stderr)
                status = 1
                break
            time.sleep(0.05)  # waiting on another process: there is no portable event for its exit
        else:
            print(f"stopped relay daemon pid {pid} ({state['listen']})")
    return status


def _tail(path: Path, n: int) -> list[str]:
    lines: deque[str] = deque(maxlen=max(0, n))
    for candidate in (path.with_name(path.name + ".1"), path):  # the newest rotated file, then the live one
        try:
            with open(candidate, encoding="utf-8", errors="replace") as fh:
                lines.extend(line.rstrip("\n") for line in fh)
        except FileNotFoundError:
            continue
    return list(lines)


def _log_sources(auth: bool) -> list[tuple[str, Path]]:
    """``(broker, log file)`` of every running broker of this user: each daemon (its state file) and, for the
    daemon log, each Jupyter server with the relay extension (``server/server_state.py``)."""
    from ..server.daemon import AUTH_LOG, DAEMON_LOG, LOG_DIR, read_states
    from ..server.server_state import server_states

    name = AUTH_LOG if auth else DAEMON_LOG
    found = [(f"daemon {s['listen']} (pid {s['pid']})", Path(s["data_dir"]) / LOG_DIR / name) for s in read_states()]
    if not auth:  # a Jupyter server has no auth log: Jupyter authenticates its requests
        found += [(f"jupyter server {s.get('url')} (pid {s['pid']})", Path(s["log_file"])) for s in server_states()
                  if s.get("log_file")]
    return found


def _cmd_logs(args: argparse.Namespace) -> int:
    from ..server.daemon import AUTH_LOG, DAEMON_LOG, LOG_DIR  # server.daemon imports the broker: only when used

    if args.data_dir:
        sources = [("", Path(args.data_dir) / LOG_DIR / (AUTH_LOG if args.auth else DAEMON_LOG))]
    else:
        sources = _log_sources(args.auth) or [
            ("", data_dir(create=False) / LOG_DIR / (AUTH_LOG if args.auth else DAEMON_LOG))]
    present = [(broker, path) for broker, path in sources if path.exists()]
    if not present:
        path = sources[0][1]
        raise RoutingRefusal(Code.NOT_FOUND, f"no log at {path} (has a daemon run with this data dir?)")
    for broker, path in present:
        if len(present) > 1:  # several brokers: say whose lines follow
            print(f"==> {broker}: {path} <==")
        for line in _tail(path, args.lines):
            print(line)
    return 0
