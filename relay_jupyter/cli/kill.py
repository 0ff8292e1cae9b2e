"""``jupyter relay kill``: the kill switch from a terminal (issue 13 item 2; the side panel's "Stop all runs",
``relay.kill()`` in a kernel).

It reaches every broker of this user and calls its ``kill`` RPC (docs/protocol.md): every run stops and every
pending permission request is denied.

- **Jupyter servers** (the ``jpserver-*.json`` files of this user's runtime dir, read as
  ``jupyter_server.serverapp.list_running_servers`` reads them): ``POST <url>relay/rpc`` ``kill {all: true}``
  (or ``{origin}``) authenticated with the server's token, which makes the call the server's own user, as the
  side panel's is. A server without the relay extension (HTTP 404) is skipped. The token is read from the
  server's private info file and sent only to that server's loopback address, never through an environment
  proxy.
- **Standalone daemons** (``jupyter relay status``'s state files): the command is the daemon's terminal
  client (``X-Relay-Client: terminal``, which may stop every run of its daemon: ``Caller.stops_all``) and
  calls ``kill {all: true}`` (or ``{origin}``). It cannot act as a notebook: a kernel's origin is bound to
  the daemon credential the kernel holds (docs/daemon.md), and stopping needs none.

One line per broker; exit 1 when no broker was found, 2 when one could not be stopped.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.netaddr import is_loopback_host
from ..protocol.local import UnixHTTPConnection

__all__ = ["register"]

_TIMEOUT = 10.0


def register(subparsers: Any) -> None:
    """Add ``kill`` to ``jupyter relay``."""
    k = subparsers.add_parser("kill", help="stop every run and deny every pending request, in every broker of "
                                           "this user (Jupyter servers and daemons)")
    k.add_argument("--origin", help="only this notebook (e.g. notebook:analysis.ipynb, daemon:kernel:nb.ipynb)")
    k.add_argument("--json", action="store_true", help="machine-readable output")
    k.set_defaults(func=_cmd_kill)


def _rpc_body(params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "kill", "params": params}).encode()


def _result(raw: bytes) -> dict[str, Any]:
    reply = json.loads(raw)
    if not isinstance(reply, dict):
        raise ValueError("not a JSON-RPC answer")
    if reply.get("error"):
        error = reply["error"]
        code = (error.get("data") or {}).get("code") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else str(error)
        raise ValueError(f"{message} [{code}]" if code else str(message))
    result = reply.get("result") or {}
    return {"cancelled_runs": int(result.get("cancelled_runs", 0)),
            "denied_requests": int(result.get("denied_requests", 0))}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # it exists (another user's): as jupyter_server.utils.check_pid says
    except (OSError, OverflowError):
        return False
    return True


def _servers() -> list[dict[str, Any]]:
    """The running Jupyter servers' info files, read as ``jupyter_server.serverapp.list_running_servers`` reads
    them (``jpserver-*.json`` of the runtime dir whose pid is alive; a file being written is skipped).

    Our own reader (stdlib, 15 lines) because importing ``jupyter_server.serverapp`` (jupyter_events, jsonschema's
    format checkers) took 7 s of `jupyter relay status`'s 25 s on the loaded 2-core CI machine (python -X
    importtime): ``status``, ``logs`` and ``kill`` only need these files. Unlike that function it removes no
    file: a status command changes nothing.
    """
    from jupyter_core.paths import jupyter_runtime_dir

    folder = jupyter_runtime_dir()
    try:
        names = sorted(os.listdir(folder))
    except OSError:  # no runtime dir yet
        return []
    found = []
    for name in names:
        if not re.match(r"jpserver-(.+)\.json$", name):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):  # being written or removed meanwhile
            continue
        if isinstance(info, dict) and info.get("url") and isinstance(info.get("pid"), int) and _pid_alive(info["pid"]):
            found.append(info)
    return found


def _kill_server(info: dict[str, Any], origin: str | None) -> dict[str, Any]:
    url = str(info["url"])
    out: dict[str, Any] = {"broker": f"jupyter server {url}", "error": None}
    host = urlsplit(url).hostname or ""
    if not is_loopback_host(host):
        # the token would leave the machine: refuse (a remote server's panel has its own kill switch)
        out["error"] = f"not a loopback address ({host}); use that server's side panel"
        return out
    params: dict[str, Any] = {"origin": origin} if origin else {"all": True}
    request = urllib.request.Request(url.rstrip("/") + "/relay/rpc", data=_rpc_body(params), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"token {info.get('token') or ''}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(request, timeout=_TIMEOUT) as response:
            out.update(_result(response.read(1 << 20)))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            out["skipped"] = True  # no relay extension in this server
        else:
            out["error"] = f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        out["error"] = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
    return out


def _daemon_kill(state: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    from ..server.daemon_auth import TERMINAL_CLIENT, read_token, token_path  # tornado: only when used

    parts = urlsplit(state["listen"])
    headers = {"Content-Type": "application/json", "X-Relay-Client": TERMINAL_CLIENT}
    conn: http.client.HTTPConnection
    if parts.scheme == "unix":
        conn = UnixHTTPConnection(parts.path, _TIMEOUT)
    else:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=_TIMEOUT)
        token = read_token(token_path(Path(state["data_dir"])))
        if token:
            headers["Authorization"] = "Bearer " + token.decode("ascii")
    try:
        conn.request("POST", "/relay/rpc", _rpc_body(params), headers)
        return _result(conn.getresponse().read(1 << 20))
    finally:
        conn.close()


def _kill_daemon(state: dict[str, Any], origin: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"broker": f"daemon {state['listen']} (pid {state['pid']})", "error": None,
                           "cancelled_runs": 0, "denied_requests": 0}
    try:
        out.update(_daemon_kill(state, {"origin": origin} if origin else {"all": True}))
    except (OSError, ValueError, http.client.HTTPException) as exc:
        out["error"] = str(exc) or type(exc).__name__
    return out


def _cmd_kill(args: argparse.Namespace) -> int:
    from ..server.daemon import read_states  # server.daemon imports the broker: only when used

    origin = args.origin.strip() if args.origin else None
    results = [_kill_server(s, origin) for s in _servers()]
    results = [r for r in results if not r.get("skipped")]
    results += [_kill_daemon(state, origin) for state in read_states()]
    if args.json:
        print(json.dumps({"brokers": results}, indent=2))
    elif not results:
        print("no relay broker is running (no Jupyter server with the relay extension, no daemon)")
    for r in results if not args.json else []:
        if r["error"]:
            print(f"{r['broker']}: not stopped: {r['error']}")
        else:
            print(f"{r['broker']}: stopped {r['cancelled_runs']} run(s), denied {r['denied_requests']} "
                  "permission request(s)")
    if not results:
        return 1
    return 2 if any(r["error"] for r in results) else 0
