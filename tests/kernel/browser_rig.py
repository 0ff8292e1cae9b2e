"""The rig of the browser tests in tests/kernel: Debian chromium through Playwright, JupyterLab + the relay
extension with FakeAnthropic as the model, the wait for a page's kernel, the relay side panel.

Before, each browser module (test_browser, test_focus, test_panel_hostile, test_panel_trust_sessions) carried its
own copy of the launch, the module fixture, the kernel wait loop and the panel opening.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic

from .real_server import RealServer

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
MODEL = "claude-fake-1"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]

# every element attribute that can hold a URL, read raw (getAttribute) and as the browser resolved it
_URLS_JS = """() => {
  const out = [];
  for (const el of document.querySelectorAll('*')) {
    for (const attr of ['href', 'src', 'action', 'formaction', 'data', 'xlink:href', 'srcdoc', 'background']) {
      const raw = el.getAttribute(attr);
      if (raw !== null) out.push([el.tagName.toLowerCase(), attr, raw, String(el[attr] || '')]);
    }
  }
  return out;
}"""


@pytest.fixture(autouse=True)
def jp_asyncio_loop() -> Iterator[None]:
    """Replaces pytest-jupyter's autouse loop fixture (import it into a browser module): it would pick up (and
    close) the event loop that sync Playwright runs in this thread. These tests use no in-process Jupyter server."""
    yield None


@pytest.fixture(autouse=True)
def jp_server_cleanup() -> Iterator[None]:
    """pytest-jupyter's cleanup of its in-process server, which these tests do not start."""
    yield None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Debian chromium (skips the test when it is not installed); closed on exit."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def lab_with_fake(tmp: Path, **relay_config: Any) -> Iterator[tuple[RealServer, FakeAnthropic, Any]]:
    """JupyterLab with the relay extension, FakeAnthropic as its model, and a browser: ``(srv, fake, browser)``.
    ``relay_config`` adds to the RelayApp configuration (e.g. ``in_memory=False`` for a broker on disk)."""
    with chromium() as browser, FakeAnthropic(api_key="test-key") as fake:
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "default_model": MODEL,
                  **relay_config}
        with RealServer(tmp, config, lab=True) as srv:
            yield srv, fake, browser


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic, Any]]:
    """One JupyterLab (broker in memory), FakeAnthropic and a browser for the module that imports this fixture."""
    with lab_with_fake(tmp_path_factory.mktemp("lab")) as served:
        yield served


def wait_for_idle_kernel(page: Any) -> bool:
    """JupyterLab may ask which kernel to use for the notebook (also a moment later): take the preferred one;
    then wait until the kernel is connected and idle (up to a minute), or the run requests could go nowhere.
    False when it never became idle."""
    idle = page.get_by_text("Python 3 (ipykernel) | Idle")
    for _ in range(240):
        accept = page.locator(".jp-Dialog .jp-mod-accept")
        if accept.count():
            accept.first.click()
        elif idle.count():
            return True
        page.wait_for_timeout(250)
    return False


def open_relay_panel(page: Any) -> Any:
    """Open the relay side panel from the right sidebar; its locator once it says it is connected."""
    page.locator('.jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id="relay-jupyter-panel"]').click()
    panel = page.locator("#relay-jupyter-panel")
    panel.get_by_text("Connected to the relay broker.").wait_for(timeout=60_000)
    return panel
