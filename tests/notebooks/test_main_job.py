"""The main job (issue 7 item 4), in a real browser: `make lab` opens ``notebooks/quickstart.ipynb`` in
JupyterLab with the relay extension on a machine with no key. The first ``%%agent`` cell shows the connect
card; after Connect the demo backend answers, says it is a demo and how to configure a real backend; the
relay side panel shows the notebook's grant. Screenshots go to ``artifacts/``.

Nothing is configured for the test beyond what a fresh install has: JupyterLab is started the way the
Makefile does (``jupyter lab <notebook>``), with the extension enabled by the installed server config, in
temporary JUPYTER_* folders, with every model key and CI variable removed from its environment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"
ARTIFACTS = REPO / "artifacts"
CHROMIUM = "/usr/bin/chromium"
TOKEN = "relay-main-job-token"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
# a key or CI flag inherited from the machine running the tests would change what a fresh machine sees
_SCRUBBED = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "RELAY_ANTHROPIC_API_KEY",
             "RELAY_OPENAI_API_KEY", "CI", "RELAY_HEADLESS", "RELAY_HEADLESS_ALLOW")


def make_lab_arguments() -> list[str]:
    """What README's first command, ``make lab``, passes to ``jupyter lab``: the Makefile's ``lab`` recipe after
    ``jupyter lab`` (``$(ROOT_FLAG)`` dropped: the test passes ``--allow-root`` itself), so a flag taken out of
    the Makefile (``--LabApp.default_url``: the quickstart, not the Launcher) is taken out of this test too."""
    readme = (REPO / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n", readme)
    assert first is not None and first.group(1).split("#")[0].split() == ["make", "lab"], "README's first command"
    recipe = re.search(r"^lab:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.M)
    assert recipe is not None, "the Makefile has no lab recipe"
    words = shlex.split(recipe.group(1))
    at = next(i for i, w in enumerate(words) if w.endswith("/jupyter")) + 1
    assert words[at] == "lab", words
    return [w for w in words[at + 1:] if w != "$(ROOT_FLAG)"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """``jupyter lab quickstart.ipynb`` in temporary JUPYTER_* folders; stopped on exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "notebooks"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"

    def __enter__(self) -> Self:
        # a copy, so JupyterLab's autosave never writes into the repository's notebook; without the stored
        # outputs (from nbval's headless run), so everything the test sees was produced by this run
        self.root.mkdir()
        notebook = json.loads(QUICKSTART.read_text())
        for cell in notebook["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
        (self.root / QUICKSTART.name).write_text(json.dumps(notebook))
        labconfig = self.tmp / "config" / "labconfig"
        labconfig.mkdir(parents=True)
        (labconfig / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED and not k.startswith(("RELAY_", "JUPYTER_"))}
        env.update(JUPYTER_CONFIG_DIR=str(self.tmp / "config"), JUPYTER_DATA_DIR=str(self.tmp / "data"),
                   JUPYTER_RUNTIME_DIR=str(self.tmp / "runtime"), IPYTHONDIR=str(self.tmp / "ipython"))
        self.log = open(self.tmp / "lab.log", "wb")
        # the notebook argument is the Makefile's notebooks/quickstart.ipynb, relative to this copy's root
        args = [QUICKSTART.name if w == "notebooks/quickstart.ipynb" else w for w in make_lab_arguments()]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab.labapp", *args, "--no-browser", "--allow-root",
             "--ip", "127.0.0.1", "--port", str(self.port), f"--IdentityProvider.token={TOKEN}"],
            cwd=self.root, env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}api/status?token={TOKEN}", timeout=5):
                    return self
            except OSError:
                time.sleep(0.2)  # waiting for another process to bind its port
        self.__exit__()
        raise RuntimeError("jupyter lab did not start:\n" + self.server_log())

    def server_log(self) -> str:
        return (self.tmp / "lab.log").read_text(errors="replace")[-4000:]

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


@pytest.fixture(autouse=True)
def jp_asyncio_loop() -> Iterator[None]:
    """Replaces pytest-jupyter's autouse loop fixture (import it with ``lab_page``): per test it would close the
    event loop sync Playwright runs in this thread, which the module's browser outlives (as tests/kernel/browser_rig)."""
    yield None


@pytest.fixture(autouse=True)
def jp_server_cleanup() -> Iterator[None]:
    """pytest-jupyter's cleanup of its in-process server, which these tests do not start."""
    yield None


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Any]]:
    """One ``make lab`` JupyterLab and one Chromium per module (import it with ``lab_page``): a JupyterLab start is
    most of a test's time here (each test had its own before: test_panel_live's four started four)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with Lab(tmp_path_factory.mktemp("lab")) as lab, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield lab, browser
        finally:
            browser.close()


@pytest.fixture
def lab_page(lab_server: tuple[Lab, Any]) -> Iterator[tuple[Lab, Any]]:
    """The module's JupyterLab and a fresh page (its own browser context) for one test. A test that opens a
    notebook uses a workspace of its own (``lab/workspaces/<name>/tree/...?reset``): the default workspace would
    restore the notebooks of the tests before it."""
    lab, browser = lab_server
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        yield lab, context.new_page()
    finally:
        context.close()


def wait_for_kernel(page: Any) -> None:
    """Wait until the open notebook's kernel is idle (a "select a kernel" dialog: take the preferred one); the
    browser tests of tests/notebooks share it."""
    idle = page.get_by_text("Python 3 (ipykernel) | Idle")
    for _ in range(240):
        accept = page.locator(".jp-Dialog .jp-mod-accept")
        if accept.count():  # "select a kernel" dialog: take the preferred one
            accept.first.click()
        if idle.count():
            return
        page.wait_for_timeout(250)
    raise AssertionError("the notebook's kernel never became idle")


def open_relay_panel(page: Any) -> Any:
    """Open the relay side panel from the right sidebar; its locator once it says it is connected."""
    page.locator('.jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id="relay-jupyter-panel"]').click()
    panel = page.locator("#relay-jupyter-panel")
    panel.get_by_text("Connected to the relay broker.").wait_for(timeout=60_000)
    return panel


def _first_agent_cell() -> int:
    cells = json.loads(QUICKSTART.read_text())["cells"]
    return next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("%%agent"))


def test_make_lab_opens_the_quickstart_and_the_demo_answers(lab_page: tuple[Lab, Any]) -> None:
    lab, page = lab_page
    # what `make lab` gives a person without a browser on that machine: the URL Jupyter prints (and its
    # jpserver-*-open.html) is the quickstart's, and opening the server's root lands there too, not in the Launcher
    printed = re.findall(rf"{re.escape(lab.url)}\S*token=\S+", lab.server_log())
    assert printed and all(u.startswith(f"{lab.url}lab/tree/{QUICKSTART.name}?") for u in printed), printed
    openers = {p.name: p.read_text() for p in (lab.tmp / "runtime").glob("jpserver-*-open.html")}
    assert openers and all(f"/lab/tree/{QUICKSTART.name}" in t for t in openers.values()), openers
    page.goto(f"{lab.url}?token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    tabs = page.locator(".jp-mod-current .lm-TabBar-tabLabel, #jp-main-dock-panel .lm-TabBar-tabLabel")
    tabs.filter(has_text=QUICKSTART.name).first.wait_for(timeout=30_000)
    assert "Launcher" not in tabs.all_inner_texts(), tabs.all_inner_texts()
    assert page.url.split("?")[0].endswith(f"/lab/tree/{QUICKSTART.name}"), page.url
    wait_for_kernel(page)
    page.screenshot(path=str(ARTIFACTS / "main-job-opened.png"))

    # run every cell up to and including the first %%agent cell, as a reader does with Shift+Enter
    page.locator(".jp-Cell").first.click()
    for _ in range(_first_agent_cell() + 1):
        page.keyboard.press("Shift+Enter")

    # inside JupyterLab the notebook uses the server's broker, and a person connects it with a click
    page.get_by_text("relay: using the broker of this Jupyter server").wait_for(timeout=60_000)
    connect = page.get_by_role("button", name="Connect")
    connect.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "main-job-connect-card.png"))
    connect.click()

    outputs = page.locator(".jp-OutputArea-output")
    greeting = outputs.filter(has_text="[demo] Hello!")          # the answer says it is a demo ...
    greeting.first.wait_for(timeout=60_000)
    footer = outputs.filter(has_text="✓ done").filter(has_text="tokens")
    footer.first.wait_for(timeout=60_000)  # the run ended (the footer replaces the working indicator)
    notice = outputs.filter(has_text="This is the relay demo backend").first.inner_text()
    assert "ANTHROPIC_API_KEY" in notice and "openai_base_url" in notice, notice  # ... and how to configure one
    page.screenshot(path=str(ARTIFACTS / "main-job-demo-answer.png"))

    # the relay side panel (labextension relay-jupyter) shows this notebook's grant
    page.locator('.jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id="relay-jupyter-panel"]').click()
    panel = page.locator("#relay-jupyter-panel")
    panel.wait_for(state="visible", timeout=30_000)
    panel.get_by_text("Connected to the relay broker.").wait_for(timeout=30_000)
    panel.locator(".jp-relay-grants").get_by_text("quickstart.ipynb", exact=False).first.wait_for(timeout=30_000)
    # its budget line is the broker's budget.get usage (it read a field that does not exist: always 0)
    line = panel.locator(".jp-relay-grant").filter(has_text="quickstart.ipynb").first
    try:
        line.get_by_text(re.compile(r"[1-9][\d,]* of 200,000 tokens, \$\d+\.\d{4} of \$5\.00 today")).wait_for(
            timeout=30_000)
    except Exception as exc:
        raise AssertionError(line.inner_text()) from exc
    page.screenshot(path=str(ARTIFACTS / "main-job-side-panel.png"))
    assert "relay" in lab.server_log().lower()
