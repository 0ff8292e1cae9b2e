"""Issue 19 item 1 (Notebook 7): the side panel works in Notebook 7's shell too.

The plugin used to require JupyterLab's ``ILabShell``, which Notebook 7 does not provide, so Notebook 7 skipped it
("Plugin 'relay-jupyter:panel' failed to activate. TypeError: No provider for: @jupyterlab/application:ILabShell")
and no panel appeared. It now uses the front end's own shell (``app.shell``), whose right area both take.

Real parts: Notebook 7 (the release that pairs with the installed JupyterLab, installed for this test into a
temporary folder, not into the project venv) with the relay server extension, headless Chromium opening a
notebook, the panel opened from Notebook 7's View > Right Sidebar menu, talking to the broker."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed")
    import jupyterlab

    minor = int(jupyterlab.__version__.split(".")[1])  # Notebook 7.N is built on JupyterLab 4.N
    target = tmp_path_factory.mktemp("nb7")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                           "--target", str(target), f"notebook>=7.{minor},<7.{minor + 1}"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # Notebook reads its settings schemas from the JupyterLab app dir: one that holds Lab's and Notebook's
    lab = Path(sys.prefix) / "share" / "jupyter" / "lab"
    app_dir = target / "lab-app-dir"
    (app_dir / "schemas").mkdir(parents=True)
    for entry in [*(lab / "schemas").iterdir(), *(target / "share" / "jupyter" / "lab" / "schemas").iterdir()]:
        (app_dir / "schemas" / entry.name).symlink_to(entry)
    for entry in lab.iterdir():
        if entry.name != "schemas":
            (app_dir / entry.name).symlink_to(entry)
    return target


@pytest.fixture
def server(notebook7: Path, tmp_path: Path) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "RELAY_", "ANTHROPIC_"))}
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), IPYTHONDIR=str(tmp_path / "ipy"),
               PYTHONPATH=str(notebook7), JUPYTER_PATH=str(notebook7 / "share" / "jupyter"),
               JUPYTERLAB_DIR=str(notebook7 / "lab-app-dir"))
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": [], "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}))
    port = _free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "notebook", "--no-browser", "--allow-root", "--ip", "127.0.0.1",
                                 "--port", str(port), "--IdentityProvider.token=t",
                                 "--ServerApp.jpserver_extensions={'notebook': True, 'relay_jupyter': True}"],
                                cwd=tmp_path, env=env, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/relay/healthz?token=t", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(log.read_text(errors="replace")[-3000:]) from None
                time.sleep(0.3)  # another process's port: nothing to await
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(tmp_path / "rt", ignore_errors=True)


def test_the_side_panel_opens_in_notebook_7_and_talks_to_the_broker(server: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            relay: list[tuple[int, str]] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("response", lambda r: relay.append((r.status, r.url)) if "/relay/" in r.url else None)
            page.goto(f"{server}/notebooks/nb.ipynb?token=t", timeout=120_000)
            page.wait_for_selector("#relay-jupyter-panel", state="attached", timeout=120_000)
            assert not page.is_visible("#relay-jupyter-panel")  # Notebook 7's right area starts closed
            # Notebook 7 lists side-panel widgets under View > Right Sidebar, by their caption
            page.click("text=View")
            page.hover("text=Right Sidebar")
            page.click("text=Show Relay: approvals, grants, budgets, audit")
            page.wait_for_selector("#relay-jupyter-panel h2:has-text('Relay')", state="visible", timeout=30_000)
            assert page.is_visible("#relay-jupyter-panel >> text=Stop all runs")
            # the panel's first refresh (grants, runs, pending) and its event stream
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not ({"rpc", "events"} <= {u.split("/relay/")[1].split("?")[0]
                                                                            for s, u in relay if s == 200}):
                page.wait_for_timeout(100)  # responses arrive on the browser's schedule: look again
        finally:
            browser.close()
    assert any(status == 200 and "/relay/rpc" in url for status, url in relay), relay
    assert any(status == 200 and "/relay/events" in url for status, url in relay), relay
    assert not [e for e in errors if "relay" in e.lower()], errors
