"""The notebook a headless runner names on its command line (kernel/discovery.py ``notebook_from_argv``), the
kernel's way to learn its path under papermill / jupyter execute / nbconvert (issue 19 item 4). The end-to-end
runs are tests/daemon/test_headless_runners.py; here every form and every way to get it wrong."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relay_jupyter.kernel.discovery import client_name_for, notebook_from_argv, notebook_path, runner_notebook

PY = "/v/bin/python"


@pytest.mark.parametrize(("argv", "expected"), [
    ([PY, "/v/bin/papermill", "in.ipynb", "out.ipynb"], "/w/in.ipynb"),
    ([PY, "-m", "papermill", "sub/in.ipynb", "out.ipynb", "-k", "python3"], "/w/sub/in.ipynb"),
    # option values are not the input, whatever they look like
    ([PY, "/v/bin/papermill", "-p", "source", "other.ipynb", "-k", "x.ipynb", "in.ipynb", "o.ipynb"], "/w/in.ipynb"),
    ([PY, "/v/bin/papermill", "--cwd", "/elsewhere", "/abs/in.ipynb", "o.ipynb"], "/abs/in.ipynb"),
    (["/v/bin/papermill", "../up/in.ipynb", "o.ipynb"], "/up/in.ipynb"),
    ([PY, "/v/bin/jupyter-execute", "b.ipynb"], "/w/b.ipynb"),
    ([PY, "/v/bin/jupyter-execute", "--inplace", "b.ipynb"], "/w/b.ipynb"),
    ([PY, "/v/bin/jupyter-nbconvert", "--to", "notebook", "--execute", "c.ipynb"], "/w/c.ipynb"),
    ([PY, "-m", "pytest", "--nbval-lax", "d.ipynb"], "/w/d.ipynb"),
])
def test_a_runner_names_its_notebook(argv: list[str], expected: str) -> None:
    assert notebook_from_argv(argv, "/w") == expected


@pytest.mark.parametrize("argv", [
    [PY, "script.py", "a.ipynb"],                                   # a script: not a runner, whatever its arguments
    [PY, "/v/bin/jupyter-execute", "a.ipynb", "b.ipynb"],           # several notebooks in one process: ambiguous
    [PY, "-m", "pytest", "--nbval", "notebooks/"],                  # a directory
    [PY, "/v/bin/papermill", "-", "out.ipynb"],                     # stdin
    [PY, "/v/bin/papermill", "s3://bucket/in.ipynb", "out.ipynb"],  # a URL is not a local notebook
    [PY, "/v/bin/papermill", "--help"],
    [PY, "-c", "import papermill"],
    [],
])
def test_no_notebook_when_the_command_line_does_not_name_exactly_one(argv: list[str]) -> None:
    assert notebook_from_argv(argv, "/w") is None


def test_the_kernel_reads_its_parent_runner_and_explicit_settings_win(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # a real parent process whose command line is a papermill one: the child reads /proc/<ppid>
    runner = tmp_path / "papermill"
    runner.write_text("import subprocess, sys\n"
                      "code = 'from relay_jupyter.kernel.discovery import runner_notebook; print(runner_notebook())'\n"
                      "print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RELAY_NOTEBOOK", "JPY_SESSION_NAME")}
    out = subprocess.run([sys.executable, str(runner), "daily.ipynb", "out.ipynb"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert out == str(tmp_path / "daily.ipynb")
    assert runner_notebook(999_999_999) is None  # no such process
    # RELAY_NOTEBOOK and the Jupyter session name come first
    monkeypatch.setenv("RELAY_NOTEBOOK", "named.ipynb")
    assert notebook_path({}) == "named.ipynb"


def test_names_fit_the_daemon_and_differ_per_path() -> None:
    a, b = client_name_for("/home/me/reports/" + "x" * 80 + "/daily.ipynb"), client_name_for("/tmp/daily.ipynb")
    assert len(a) <= 64 and a.endswith("daily.ipynb") and b == "kernel:tmp_daily.ipynb" and a != b
