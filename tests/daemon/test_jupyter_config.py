"""One configuration (issue 19 item 3): the standalone daemon reads ``c.RelayApp.*`` from the user's Jupyter
config files, as the server extension does, so a daemon started on demand uses the configured model server
instead of the demo backend. ``--config`` and flags still override the files; a broken file is one line."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from daemon_harness import env_for, run_cli, start_daemon

from relay_jupyter.server.jupyter_config import broker_settings_from_files, config_files
from relay_jupyter.testing import FakeOpenAI

MODEL = "gpt-fake-1"


def _cfg(root):
    cfg = root / "cfg"
    cfg.mkdir(parents=True, exist_ok=True)
    return cfg


def test_a_daemon_uses_the_openai_server_of_jupyter_server_config_py(tmp_path):
    with FakeOpenAI() as fake:
        (_cfg(tmp_path) / "jupyter_server_config.py").write_text(
            f"c.RelayApp.openai_base_url = {fake.base_url!r}\n"
            "c.RelayApp.default_backend = 'openai'\n"
            f"c.RelayApp.default_model = {MODEL!r}\n")
        done = run_cli(tmp_path, "grants", "add", "daemon:nb", "--tools", "*", "--models", "*")
        assert done.returncode == 0, done.stderr
        daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/sock/relay.sock")
        try:
            conn = daemon.connect()
            started = conn.rpc("run.start", {"conversation": "c", "prompt": "hello"},
                               headers={"X-Relay-Client": "nb"})
            assert "result" in started, started
            deadline = time.monotonic() + 60
            while not fake.requests and time.monotonic() < deadline:
                time.sleep(0.05)  # the run is in another process: poll the fake's record
            assert fake.requests, (tmp_path / "daemon.stderr").read_text()[-2000:]
            assert fake.requests[0].body["model"] == MODEL
            conn.close()
        finally:
            daemon.stop()
    log = (daemon.data_dir / "logs" / "daemon.log").read_text()
    assert "using the demo backend" not in log


def test_relay_config_json_then_config_flag_override(tmp_path):
    cfg = _cfg(tmp_path)
    (cfg / "jupyter_server_config.json").write_text(json.dumps({"RelayApp": {"consent_timeout": 40}}))
    (cfg / "jupyter_relay_config.py").write_text("c.RelayApp.consent_timeout = 50\nc.RelayApp.kernel_tool_timeout = 7\n")
    assert [f.name for f in config_files([cfg])] == ["jupyter_server_config.json", "jupyter_relay_config.py"]
    values = broker_settings_from_files([cfg])
    # later files win; only what the files name is returned (the daemon's own defaults stay)
    assert values == {"consent_timeout": 50.0, "kernel_tool_timeout": 7.0}


def test_a_broken_config_file_is_one_line_exit_2(tmp_path):
    (_cfg(tmp_path) / "jupyter_relay_config.py").write_text("c.RelayApp.consent_timeout = 'soon'\n")
    done = run_cli(tmp_path, "serve", "--listen", f"unix://{tmp_path}/s/relay.sock")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "consent_timeout" in lines[0] and "Traceback" not in done.stderr, done.stderr
    (_cfg(tmp_path) / "jupyter_relay_config.py").write_text("c.RelayApp.consent_timeout = (\n")
    done = run_cli(tmp_path, "serve", "--listen", f"unix://{tmp_path}/s/relay.sock")
    assert done.returncode == 2 and "jupyter_relay_config.py" in done.stderr and "Traceback" not in done.stderr


def test_version_prints_the_version_and_exits_0(tmp_path):
    from relay_jupyter import __version__

    done = run_cli(tmp_path, "--version")
    # as every Jupyter application (jupyter server --version): the bare version
    assert done.returncode == 0 and done.stdout.strip() == __version__, done


def _first_request(fake, daemon, client: str) -> None:
    conn = daemon.connect()
    started = conn.rpc("run.start", {"conversation": "c", "prompt": "hello"}, headers={"X-Relay-Client": client})
    assert "result" in started, started
    deadline = time.monotonic() + 60
    while not fake.requests and time.monotonic() < deadline:
        time.sleep(0.05)  # the run is in another process: poll the fake's record
    conn.close()
    assert fake.requests, (daemon.root / "daemon.stderr").read_text()[-2000:]


def test_command_line_traits_win_over_the_files_and_debug_logs_relay_lines(tmp_path):
    # the file names a dead model server; --RelayApp.openai_base_url on the command line wins (as in any Jupyter app)
    (_cfg(tmp_path) / "jupyter_relay_config.py").write_text(
        "c.RelayApp.openai_base_url = 'http://127.0.0.1:9/v1'\nc.RelayApp.default_backend = 'openai'\n"
        f"c.RelayApp.default_model = {MODEL!r}\n")
    assert run_cli(tmp_path, "grants", "add", "daemon:nb", "--tools", "*", "--models", "*").returncode == 0
    with FakeOpenAI() as fake:
        daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/sock/relay.sock",
                              f"--RelayApp.openai_base_url={fake.base_url}", "--debug")
        try:
            _first_request(fake, daemon, "nb")
            assert fake.requests[0].body["model"] == MODEL
        finally:
            daemon.stop()
    log = (daemon.data_dir / "logs" / "daemon.log").read_text()
    assert re.search(r"^\S+ \S+ DEBUG relay_jupyter\.daemon: relay daemon: log level DEBUG", log, re.M), log[-2000:]
    read = next(line for line in log.splitlines() if "relay daemon: Jupyter config files read" in line)
    assert " INFO " in read and str(_cfg(tmp_path) / "jupyter_relay_config.py") in read
    assert "[relay DEBUG]" in (tmp_path / "daemon.stderr").read_text()  # and on stderr


def test_without_debug_the_daemon_log_has_no_debug_lines(tmp_path):
    daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/sock/relay.sock")
    try:
        conn = daemon.connect()
        assert conn.request("GET", "/relay/healthz")[0] == 200
        conn.close()
    finally:
        daemon.stop()
    log = (daemon.data_dir / "logs" / "daemon.log").read_text()
    assert "relay daemon listening" in log or " INFO " in log, log
    assert " DEBUG " not in log, log


@pytest.mark.slow
def test_a_daemon_started_on_demand_by_a_headless_kernel_uses_the_config_file(tmp_path, monkeypatch):
    """nbclient runs a notebook with no RELAY_URL: the kernel starts the user's daemon itself
    (kernel/discovery.py), and that daemon reads c.RelayApp.openai_base_url from the user's Jupyter config."""
    import nbformat
    from nbclient import NotebookClient

    from relay_jupyter.testing import FakeOpenAI as Fake

    env = env_for(tmp_path)
    with Fake() as fake:
        (_cfg(tmp_path) / "jupyter_server_config.py").write_text(
            f"c.RelayApp.openai_base_url = {fake.base_url!r}\nc.RelayApp.default_backend = 'openai'\n"
            f"c.RelayApp.default_model = {MODEL!r}\n")
        assert run_cli(tmp_path, "grants", "add", "daemon:kernel:on_demand.ipynb", "--tools", "*",
                       "--models", "*").returncode == 0
        for key in [k for k in os.environ if k.startswith(("RELAY_", "JPY_", "JUPYTER_"))]:
            monkeypatch.delenv(key)
        for key in ("JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR"):
            monkeypatch.setenv(key, env[key])  # the kernel, and the daemon it starts, inherit these
        monkeypatch.setenv("RELAY_NOTEBOOK", "on_demand.ipynb")
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in ("%load_ext relay_jupyter", "%%agent\nhello")]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        try:
            NotebookClient(nb, timeout=120, kernel_name="python3").execute()
        finally:
            stopped = run_cli(tmp_path, "stop")  # the daemon the kernel started, through its own command
        assert "stopped relay daemon" in stopped.stdout, (stopped.stdout, stopped.stderr)
        assert fake.requests and fake.requests[0].body["model"] == MODEL, nb.cells[1].outputs
    log = (tmp_path / "data" / "relay" / "logs" / "daemon.log").read_text()
    read = next(line for line in log.splitlines() if "relay daemon: Jupyter config files read" in line)
    assert str(_cfg(tmp_path) / "jupyter_server_config.py") in read
