"""relay-jupyter installs the way a user gets it (issue 19 item 1): the wheel is built from the committed
tree, installed into a clean virtual environment with JupyterLab (no source tree, no node, no
``labextension develop`` link), and then

- ``jupyter labextension list`` lists the side panel as a prebuilt extension (``install.json``);
- ``jupyter server extension list`` validates the server extension;
- a real JupyterLab from that environment shows the side panel in headless Chromium;
- a wheel whose panel was not built is a build error, not a wheel without a panel;
- the sdist holds what a wheel is built from and nothing else (no tests, benchmarks, CI scripts).

Slow (a wheel build with jlpm, a clean venv with JupyterLab from the package index): marked ``slow`` and
``browser``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# a wheel build and a clean venv with JupyterLab take minutes on a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
TOKEN = "relay-wheel-test-token"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
PANEL = "share/jupyter/labextensions/relay-jupyter"


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _committed_tree(dest: Path) -> Path:
    """The committed tree (what a fresh clone holds): no built panel, no node_modules, no venv."""
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=REPO, capture_output=True,
                             check=True).stdout
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    assert not (dest / "relay_jupyter" / "labextension").exists()
    return dest


def _build(tree: Path, kind: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # --no-isolation: the test venv already holds the build requirements (hatchling, hatch-jupyter-builder,
    # jupyterlab for jlpm), so no second copy of JupyterLab is downloaded for the build environment
    return _run([sys.executable, "-m", "build", f"--{kind}", "--no-isolation", "--outdir", str(out), "."],
                cwd=tree, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = _committed_tree(tmp_path_factory.mktemp("wheel") / "src")
    out = tree.parent / "dist"
    done = _build(tree, "wheel", out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (found,) = out.glob("relay_jupyter-*.whl")
    return found


@pytest.fixture(scope="module")
def clean_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "v"
    # no pip of its own (ensurepip cost ~7 s here): this pip installs into it (pip --python), as test_minimums does
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                 "--disable-pip-version-check", str(wheel), "jupyterlab>=4.6,<5"], timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def _jupyter_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "RELAY_", "ANTHROPIC_"))}
    env.pop("CI", None)
    env.update(JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_DATA_DIR=str(tmp / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), IPYTHONDIR=str(tmp / "ipython"))
    return env


def test_wheel_ships_the_panel_and_the_server_config(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n]
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert f"{PANEL}/package.json" in data and f"{PANEL}/install.json" in data
    assert any(n.startswith(f"{PANEL}/static/remoteEntry.") for n in data)
    assert "etc/jupyter/jupyter_server_config.d/relay_jupyter.json" in data
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # JupyterLab's Extension Manager finds prebuilt extensions by this classifier
    assert "Classifier: Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt" in meta
    assert "License-Expression: BSD-3-Clause" in meta and "Project-URL: Source" in meta


def test_a_wheel_without_the_panel_is_a_build_error(tmp_path: Path) -> None:
    tree = _committed_tree(tmp_path / "src")
    # hatch-jupyter-builder's own switch to skip npm: the panel is then not built, and the build must fail
    done = _build(tree, "wheel", tmp_path / "dist", HATCH_JUPYTER_BUILDER_SKIP_NPM="1")
    assert done.returncode != 0
    assert "relay_jupyter/labextension/package.json" in done.stdout + done.stderr
    assert not list(tmp_path.glob("dist/*.whl"))


def test_sdist_holds_the_sources_and_nothing_else(tmp_path: Path) -> None:
    tree = _committed_tree(tmp_path / "src")
    done = _build(tree, "sdist", tmp_path / "dist", SKIP_JUPYTER_BUILDER="1")
    assert done.returncode == 0, done.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("relay_jupyter-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = [n.split("/", 1)[1] for n in tf.getnames() if "/" in n]
    assert "pyproject.toml" in names and "LICENSE" in names and "install.json" in names
    assert "labextension/package.json" in names and "relay_jupyter/__init__.py" in names
    for unwanted in ("tests/", "benchmarks/", ".ci/", "notebooks/", "binder/", "docs/"):
        assert not [n for n in names if n.startswith(unwanted)], unwanted


def test_clean_install_lists_the_panel_and_the_server_extension(clean_venv: Path, tmp_path: Path) -> None:
    env = _jupyter_env(tmp_path)
    labext = _run([str(clean_venv / "bin" / "jupyter"), "labextension", "list"], env=env, timeout=120)
    listing = labext.stdout + labext.stderr
    line = next((ln for ln in listing.splitlines() if "relay-jupyter" in ln), "")
    assert "enabled" in line and "OK" in line and "(python, relay-jupyter)" in line, listing
    server = _run([str(clean_venv / "bin" / "jupyter"), "server", "extension", "list"], env=env, timeout=120)
    text = server.stdout + server.stderr
    assert re.search(r"relay_jupyter\s+\S*enabled", text), text
    # the validation line: "relay_jupyter 0.1.0 OK" (an import failure prints " X ... could not be found")
    assert re.search(r"relay_jupyter\s+0\.1\.0\s+\S*OK", text), text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab_from_wheel(clean_venv: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    env = _jupyter_env(tmp_path)
    labconfig = tmp_path / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    root = tmp_path / "root"
    root.mkdir()
    port = _free_port()
    log = open(tmp_path / "lab.log", "wb")
    proc = subprocess.Popen([str(clean_venv / "bin" / "jupyter"), "lab", "--no-browser", "--allow-root",
                             "--ip", "127.0.0.1", "--port", str(port), f"--IdentityProvider.token={TOKEN}"],
                            cwd=root, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}api/status?token={TOKEN}", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError((tmp_path / "lab.log").read_text(errors="replace")[-3000:]) from None
                time.sleep(0.3)
        yield url, tmp_path / "lab.log"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def test_the_panel_from_the_wheel_loads_in_jupyterlab(lab_from_wheel: tuple[str, Path]) -> None:
    from playwright.sync_api import sync_playwright

    url, log = lab_from_wheel
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            console: list[str] = []
            page.on("console", lambda msg: console.append(msg.text))
            page.goto(f"{url}lab?token={TOKEN}")
            tab = page.locator('.jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id="relay-jupyter-panel"]')
            tab.wait_for(timeout=90_000)
            tab.click()
            panel = page.locator("#relay-jupyter-panel")
            panel.wait_for(state="visible", timeout=30_000)
            try:
                panel.get_by_text("Connected to the relay broker.").wait_for(timeout=30_000)
            except Exception as exc:
                raise AssertionError(log.read_text(errors="replace")[-3000:]) from exc
            assert not [m for m in console if "Unsatisfied version" in m and "relay" in m], console
        finally:
            browser.close()
