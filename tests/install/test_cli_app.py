"""``jupyter relay`` is a Jupyter application (issue 19 item 3): traitlets options on every command, --version,
--debug, --generate-config, and every command-line mistake as one line with exit 2.

In-process: the same ``main()`` the console script runs, with the Jupyter dirs in a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay_jupyter import __version__
from relay_jupyter.cli import main
from relay_jupyter.server.jupyter_config import broker_settings_from_files, command_line_config


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("CONFIG", "DATA", "RUNTIME"):
        monkeypatch.setenv(f"JUPYTER_{name}_DIR", str(tmp_path / name.lower()))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "0")
    return tmp_path


def test_version_is_the_bare_version_like_every_jupyter_app(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


def test_generate_config_writes_a_file_both_brokers_read(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--generate-config"]) == 0
    written = dirs / "config" / "jupyter_relay_config.py"
    text = written.read_text()
    # every broker setting is there, commented out with its default and help
    for name in ("openai_base_url", "anthropic_base_url", "consent_timeout", "default_tools", "mcp_config_path"):
        assert f"# c.RelayApp.{name} = " in text, name
    assert broker_settings_from_files() == {}  # all commented out: nothing set
    # the user uncomments a line: the daemon's settings (and RelayApp's, which reads the same file name) take it
    written.write_text(text.replace("# c.RelayApp.consent_timeout = 300.0", "c.RelayApp.consent_timeout = 12.5"))
    assert broker_settings_from_files() == {"consent_timeout": 12.5}
    # -y overwrites an existing file without asking
    capsys.readouterr()
    assert main(["--generate-config", "-y"]) == 0
    assert "c.RelayApp.consent_timeout = 12.5" not in written.read_text()


def test_command_line_settings_win_over_the_files_for_every_command(dirs: Path) -> None:
    cfg = dirs / "config"
    cfg.mkdir()
    (cfg / "jupyter_server_config.json").write_text(json.dumps({"RelayApp": {"consent_timeout": 40,
                                                                             "kernel_tool_timeout": 9}}))
    from relay_jupyter.cli.app import JupyterRelayApp

    app = JupyterRelayApp()
    app.initialize(["grants", "list", "--RelayApp.consent_timeout=7", "--debug"])
    with command_line_config(app.subapp.cli_config):
        assert broker_settings_from_files() == {"consent_timeout": 7.0, "kernel_tool_timeout": 9.0}
    assert app.subapp.log_level == 10 and app.subapp.own_argv == ["list"]
    assert broker_settings_from_files() == {"consent_timeout": 40.0, "kernel_tool_timeout": 9.0}  # only meanwhile


def test_debug_prints_relay_log_lines(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grants", "list"]) == 0
    assert "[relay DEBUG" not in capsys.readouterr().err
    for argv in (["grants", "list", "--debug"], ["--debug", "grants", "list"], ["grants", "--log-level=DEBUG", "list"]):
        assert main(argv) == 0, argv
        err = capsys.readouterr().err
        assert "[relay DEBUG relay_jupyter.server.jupyter_config] relay: config file" in err, (argv, err)


@pytest.mark.parametrize(("argv", "needle"), [
    (["nonsense"], "unknown command 'nonsense'"),
    (["grants", "list", "--RelayAp.consent_timeout=3"], "unknown option --RelayAp.consent_timeout"),
    (["grants", "list", "--RelayApp.consent_timout=3"], "unknown setting --RelayApp.consent_timout"),
    (["serve", "--RelayApp.consent_timeout=soon"], "consent_timeout"),
    (["serve", "--RelayApp.consent_timeout"], "--RelayApp.consent_timeout needs a value"),
    (["token", "path", "--log-level=LOUD"], "log_level"),
    (["--log-level=LOUD"], "log_level"),
    (["--NoSuchApp.x=1"], "unknown option --NoSuchApp.x"),
    (["grants", "add"], "the following arguments are required"),
    (["grants", "add", "daemon:x", "--tools", "a", "--nope"], "unrecognized arguments: --nope"),
    (["tools", "pin", "a__b", "maybe"], "invalid choice"),
    (["status", "--json", "extra"], "unrecognized arguments: extra"),
])
def test_every_command_line_mistake_is_one_line_exit_2(dirs: Path, capsys: pytest.CaptureFixture[str],
                                                       argv: list[str], needle: str) -> None:
    assert main(argv) == 2, argv
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jupyter relay: ") and needle in lines[0], (argv, captured.err)
    assert "Traceback" not in captured.err and "CRITICAL |" not in captured.err  # traitlets' fatal log line


def test_help_lists_commands_and_jupyter_options(dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for word in ("serve", "grants", "kill", "--debug", "--generate-config", "--RelayApp.<name>"):
        assert word in out, word
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--listen" in out and "--RelayApp.<name>=VALUE" in out
    assert main(["--help-all"]) == 0
    assert "--RelayApp.openai_base_url" in capsys.readouterr().out
