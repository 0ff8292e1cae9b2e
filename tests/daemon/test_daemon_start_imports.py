"""A daemon's start imports only what its first requests need (issue 19 "Daemon start").

A kernel outside Jupyter (VS Code, nbclient, papermill) that finds no daemon starts one and waits for its socket:
every module the daemon imports before it answers is time that kernel's first cell waits. The MCP SDK (through
``relay_jupyter/mcp/__init__.py``, the MCP sign-in and the trust methods) and ``jupyter_server`` (through the
extension's ``RelayApp``, read for the ``c.RelayApp`` settings) were imported by every start; they took most of its
4-14 s on this 2-core machine (measured: ``benchmarks/README.md`` "Daemon start").

Not a timed test: the daemon runs in a subprocess exactly as the kernel starts it (``discovery.daemon_command``, a
Jupyter config file setting ``c.RelayApp.*``), a thread of that process waits until the socket answers
``/relay/healthz`` and a kernel registration (``POST /relay/kernel``), writes ``sys.modules`` out and stops the
daemon with SIGTERM. The same run with an MCP server configured imports the SDK (the check can fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from daemon_harness import env_for

from relay_jupyter.kernel.discovery import daemon_command

#: What the daemon must not import when no MCP server is configured (top-level names in sys.modules).
HEAVY = ("mcp", "mcp_types", "jupyter_server", "jupyter_events", "jsonschema", "rfc3987_syntax")

_PROBE = textwrap.dedent("""
    import json, os, runpy, signal, sys, threading, time
    from pathlib import Path

    cmd, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    sock = cmd[cmd.index("--listen") + 1][len("unix://"):]

    def probe():
        from relay_jupyter.protocol.local import UnixHTTPConnection

        deadline = time.monotonic() + 120
        answers = {}
        while time.monotonic() < deadline:
            try:
                for method, path in (("GET", "/relay/healthz"), ("POST", "/relay/kernel")):
                    conn = UnixHTTPConnection(sock, timeout=10)
                    conn.request(method, path, body=b"" if method == "POST" else None)
                    response = conn.getresponse()
                    answers[path] = [response.status, json.loads(response.read() or b"null")]
                    conn.close()
                break
            except OSError:
                time.sleep(0.05)  # the socket file appears when the daemon binds; no event to wait on
        out.write_text(json.dumps({"answers": answers, "modules": sorted(sys.modules)}))
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=probe, daemon=True).start()
    sys.argv = ["relay_jupyter.cli", *cmd[3:]]
    runpy.run_module("relay_jupyter.cli", run_name="__main__", alter_sys=True)
""")


def _start_and_probe(tmp_path: Path, *extra: str) -> dict:
    env = env_for(tmp_path)
    cfg = tmp_path / "cfg"
    cfg.mkdir(exist_ok=True)
    # a setting from the user's Jupyter config, as a daemon started on demand reads it (server/jupyter_config.py)
    (cfg / "jupyter_server_config.py").write_text("c.RelayApp.consent_timeout = 123.0\n")
    sock = tmp_path / "rt" / "relay" / "relay.sock"
    sock.parent.mkdir(parents=True)
    sock.parent.chmod(0o700)
    out = tmp_path / "probe.json"
    cmd = [*daemon_command(sock), *extra]
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(cmd), str(out)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(out.read_text())
    assert probe["answers"]["/relay/healthz"][0] == 200, probe["answers"]
    status, registered = probe["answers"]["/relay/kernel"]
    assert status == 200 and registered["origin"].startswith("daemon:kernel:"), probe["answers"]
    # the config file was read through the settings' traits, the broker and its methods were loaded
    for module in ("relay_jupyter.server.settings", "relay_jupyter.broker.methods", "relay_jupyter.server.plain"):
        assert module in probe["modules"], module
    log = (tmp_path / "data" / "relay" / "logs" / "daemon.log").read_text()
    assert "jupyter_server_config.py" in log  # the daemon says it read the file
    return probe


def test_a_daemon_without_mcp_servers_answers_without_the_mcp_sdk_or_jupyter_server(tmp_path: Path) -> None:
    modules = set(_start_and_probe(tmp_path)["modules"])
    assert not [name for name in HEAVY if name in modules], sorted(n for n in modules if n.split(".")[0] in HEAVY)


def test_a_daemon_with_an_mcp_server_imports_the_sdk(tmp_path: Path) -> None:
    # the counter-check: the same probe sees the SDK once a server is configured (it fails to start: no such
    # command; the registry, which imports the SDK, is built before the daemon listens)
    mcp_json = tmp_path / "mcp.json"
    mcp_json.write_text(json.dumps({"mcpServers": {"gone": {"command": str(tmp_path / "no-such-mcp-server")}}}))
    mcp_json.chmod(0o600)
    modules = set(_start_and_probe(tmp_path, "--mcp-config", str(mcp_json))["modules"])
    assert "mcp" in modules and "relay_jupyter.mcp.registry" in modules
    assert "jupyter_server" not in modules
