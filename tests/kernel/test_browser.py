"""A person in JupyterLab (headless Chromium, Playwright): the card appears, Approve writes the file, Deny
leaves it absent, a hostile answer renders inert. Screenshots go to ``artifacts/``.

The stack is real: JupyterLab + the relay extension (broker, runtime), FakeAnthropic as the model, a
kernel started by the server. The model's write is the kernel tool ``run_code``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from urllib.parse import urlsplit
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .browser_rig import _URLS_JS, ARTIFACTS, MODEL, jp_asyncio_loop, jp_server_cleanup, lab, wait_for_idle_kernel  # noqa: F401
from .hostile_corpus import CORPUS, TOOL_NAMES
from .real_server import TOKEN, RealServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _notebook(path: Path, agent_cell: str) -> None:
    def cell(source: str) -> dict[str, Any]:
        return {"cell_type": "code", "execution_count": None, "id": os.urandom(4).hex(), "metadata": {},
                "outputs": [], "source": source}

    path.write_text(json.dumps({
        "cells": [cell("%load_ext relay_jupyter"), cell(agent_cell)],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))


def _run_notebook(srv: RealServer, browser: Any, name: str, watch: Callable[[Any], None] | None = None) -> Any:
    # a fresh context and workspace per notebook: no tab of an earlier test is restored
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    if watch is not None:
        watch(page)  # listeners on before the first request
    stem = name.removesuffix(".ipynb")
    page.goto(f"{srv.url}lab/workspaces/{stem}/tree/{name}?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_for_idle_kernel(page)
    for _attempt in range(3):
        page.locator(".jp-Cell").first.click()
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        try:
            page.locator(".jp-InputPrompt").filter(has_text="[1]").first.wait_for(timeout=15_000)
            break
        except Exception:  # noqa: BLE001 -- a Playwright timeout: run the cells again
            page.screenshot(path=str(ARTIFACTS / f"kernel-retry-{stem}.png"), full_page=True)
            continue
    return page


def _click_if_connect(page: Any) -> None:
    connect = page.get_by_role("button", name="Connect", exact=True)
    try:
        connect.wait_for(timeout=20_000)
    except Exception:  # noqa: BLE001 -- a Playwright timeout: no connect card
        return  # already connected by an earlier test
    connect.click()


def _write(srv: RealServer, fake: FakeAnthropic, browser: Any, name: str, button: str) -> Any:
    target = f"{name}.txt"
    _notebook(srv.root / f"{name}.ipynb", f"%%agent --model {MODEL}\nwrite {target}")
    fake.enqueue(Reply(text("I will write the file."),
                       tool_use("run_code", {"code": f"open({target!r}, 'w').write('written by the agent')"})))
    fake.enqueue(Reply(text(f"Finished with {target}.")))
    page = _run_notebook(srv, browser, f"{name}.ipynb")
    _click_if_connect(page)
    try:
        page.get_by_role("button", name="Approve", exact=True).wait_for(timeout=60_000)
    finally:
        page.screenshot(path=str(ARTIFACTS / f"kernel-{name}-card.png"), full_page=True)
    page.screenshot(path=str(ARTIFACTS / f"kernel-{name}-card.png"), full_page=True)
    page.get_by_role("button", name=button, exact=True).click()
    page.get_by_text(f"Finished with {target}.").wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / f"kernel-{name}-after.png"), full_page=True)
    return page, srv.root / target


def test_card_appears_and_approve_writes_the_file(lab: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, browser = lab
    page, target = _write(srv, fake, browser, "approve", "Approve")
    assert target.read_text() == "written by the agent"
    assert page.get_by_role("button", name="Approve", exact=True).is_disabled()
    assert page.get_by_text("Approved by you (click)").count() >= 1
    page.context.close()


def test_deny_leaves_the_file_absent(lab: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, browser = lab
    page, target = _write(srv, fake, browser, "deny", "Deny")
    assert not target.exists()
    assert page.get_by_text("Denied by you (click)").count() >= 1
    page.context.close()


def test_hostile_answer_renders_inert(lab: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, browser = lab
    hostile = ('<script>window.__pwned = 1</script> <img src=x onerror="window.__pwned = 2"> '
               '[click me](javascript:window.__pwned=3) <a href="javascript:window.__pwned=4">link</a> END-MARK')
    _notebook(srv.root / "hostile.ipynb", f"%%agent --model {MODEL}\nbe hostile")
    fake.enqueue(Reply(text(hostile)))
    page = _run_notebook(srv, browser, "hostile.ipynb")
    _click_if_connect(page)
    output = page.locator(".jp-OutputArea-output").filter(has_text="END-MARK").first
    output.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "kernel-hostile.png"), full_page=True)
    assert page.evaluate("window.__pwned") is None
    assert output.locator("script, img, a[href^='javascript']").count() == 0
    text_shown = output.inner_text()
    assert "<script>window.__pwned = 1</script>" in text_shown and "onerror" in text_shown
    for link in output.locator("a").all():  # any link left must not run code
        assert not (link.get_attribute("href") or "").lower().startswith("javascript")
    output.get_by_text("click me").first.click()
    assert page.evaluate("window.__pwned") is None
    page.context.close()


HOSTILE_CODE = ("import os\nos.remove('notes.txt')  # <img src=x onerror=window.__pwned=1>\n"
                "print('\u202e') # [x](javascript:window.__pwned=1)")

_HANDLERS_JS = """() => {
  const out = [];
  for (const el of document.querySelectorAll('.jp-OutputArea-output *')) {
    for (const attr of el.getAttributeNames()) {
      if (attr.toLowerCase().startsWith('on')) out.push(el.tagName + ' ' + attr);
    }
  }
  return out;
}"""


def test_hostile_corpus_is_inert_in_jupyterlab(lab: tuple[RealServer, FakeAnthropic, Any]) -> None:
    # the whole hostile corpus as one answer, tools with hostile names and a run_code card with hostile
    # code, in a real JupyterLab: nothing runs, no script/data link exists, nothing leaves 127.0.0.1
    srv, fake, browser = lab
    _notebook(srv.root / "corpus.ipynb", f"%%agent --model {MODEL}\nbe very hostile")
    answer = "\n\n".join(CORPUS)
    fake.enqueue(Reply(text(answer), *[tool_use(name, {name: name}) for name in TOOL_NAMES[:3]]))
    fake.enqueue(Reply(tool_use("run_code", {"code": HOSTILE_CODE})))
    fake.enqueue(Reply(text("CORPUS-END-MARK")))
    requests: list[str] = []
    dialogs: list[str] = []

    def watch(page: Any) -> None:
        page.on("request", lambda request: requests.append(request.url))
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

    page = _run_notebook(srv, browser, "corpus.ipynb", watch)
    _click_if_connect(page)
    done = page.locator(".jp-OutputArea-output").filter(has_text="CORPUS-END-MARK")
    code_seen = False
    for _ in range(240):  # deny every card that appears (the run_code one shows the code)
        if done.count():
            break
        deny = page.locator("button:not([disabled]):visible", has_text="Deny")  # the card's, not the side panel's hidden one
        if deny.count():
            code_seen = code_seen or page.get_by_text("os.remove('notes.txt')", exact=False).count() > 0
            page.screenshot(path=str(ARTIFACTS / "kernel-corpus-card.png"), full_page=True)
            deny.first.click()
        page.wait_for_timeout(250)
    done.first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)  # MathJax typesets after the output is attached
    page.screenshot(path=str(ARTIFACTS / "kernel-corpus.png"), full_page=True)
    assert code_seen, "the run_code card did not show the code"
    assert page.evaluate("window.__pwned") is None
    # every payload is still on the page as text (nothing was silently swallowed into markup)
    shown = page.locator(".jp-Notebook").inner_text()
    for marker in ("<script>window.__pwned=1</script>", "onerror", "[click](javascript:window.__pwned=1)"):
        assert marker in shown, marker
    for tag, attr, raw, resolved in page.evaluate(_URLS_JS):
        for value in (raw, resolved):
            scheme = value.strip().lower().split(":", 1)[0] if ":" in value else ""
            assert scheme not in ("javascript", "data", "vbscript", "file"), (tag, attr, raw)
        assert attr != "srcdoc", (tag, raw)
    assert page.evaluate(_HANDLERS_JS) == []
    assert page.locator(".jp-OutputArea-output img, .jp-OutputArea-output iframe, .jp-OutputArea-output "
                        "script, .jp-OutputArea-output style, .jp-OutputArea-output form").count() == 0
    # click every link the output rendered whose target is not http(s): none may run anything
    for link in page.locator(".jp-OutputArea-output a").all():
        href = (link.get_attribute("href") or "").lower()
        if not href.startswith(("http://", "https://", "mailto:")):
            link.click(force=True)
    page.wait_for_timeout(500)
    assert page.evaluate("window.__pwned") is None
    assert dialogs == []
    remote = sorted({urlsplit(url).hostname or url for url in requests
                     if urlsplit(url).scheme in ("http", "https", "ws", "wss")} - {"127.0.0.1"})
    assert remote == [], remote
    assert not any(url.startswith(("javascript:", "vbscript:")) for url in requests)
    page.context.close()


def test_restart_and_rerun_of_cell_2_of_3_forks_at_its_turn(lab: tuple[RealServer, FakeAnthropic, Any]) -> None:
    # issue 13 Deliver 4 as a person does it: three %%agent cells, Kernel > Restart (the kernel forgets its
    # chats), then cell 2 run again with Shift+Enter: the broker keys turns by the cell id JupyterLab sends, so
    # the model's request holds turn 1 and the re-run prompt (3 messages), not everything before (7)
    srv, fake, browser = lab
    cells = ["%load_ext relay_jupyter"] + [f"%%agent --model {MODEL}\nquestion {n}" for n in (1, 2, 3)]
    (srv.root / "rerun.ipynb").write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"rerun-{i}", "metadata": {}, "outputs": [],
                   "source": source} for i, source in enumerate(cells)],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))
    for n in (1, 2, 3):
        fake.enqueue(Reply(text(f"answer {n}.")))
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(f"{srv.url}lab/workspaces/rerun/tree/rerun.ipynb?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    assert wait_for_idle_kernel(page)
    page.locator(".jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    _click_if_connect(page)
    page.get_by_text("answer 1.").first.wait_for(timeout=60_000)
    page.locator(".jp-Cell").nth(2).click()
    page.keyboard.press("Shift+Enter")
    page.get_by_text("answer 2.").first.wait_for(timeout=60_000)
    page.locator(".jp-Cell").nth(3).click()
    page.keyboard.press("Shift+Enter")
    page.get_by_text("answer 3.").first.wait_for(timeout=60_000)
    assert len(fake.requests[-1].body["messages"]) == 5

    page.get_by_text("Kernel", exact=True).first.click()  # the menu bar's Kernel menu
    page.get_by_text("Restart Kernel…", exact=True).first.click()
    page.locator(".jp-Dialog .jp-mod-accept").click()  # "Restart"
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "kernel-rerun-restarted.png"), full_page=True)
    fake.enqueue(Reply(text("answer 2 again.")))
    page.locator(".jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")  # %load_ext again, as after any restart
    page.locator(".jp-Cell").nth(2).click()
    page.keyboard.press("Shift+Enter")
    page.get_by_text("answer 2 again.").first.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "kernel-rerun-after.png"), full_page=True)
    sent = fake.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"], sent
    assert "question 1" in json.dumps(sent[0]) and "question 2" in json.dumps(sent[2])
    page.context.close()
