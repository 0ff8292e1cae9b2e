"""One configuration (issue 19 item 3): the standalone daemon reads ``c.RelayApp.*`` from the user's Jupyter
config files, as the server extension does, so a daemon started on demand uses the configured model server
instead of the demo backend. ``--config`` and flags still override the files; a broken file is one line."""

from __future__ import annotations

import json
import time

from daemon_harness import run_cli, start_daemon

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
    assert done.returncode == 0 and done.stdout.strip() == f"jupyter relay {__version__}", done
