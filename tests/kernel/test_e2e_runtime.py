"""%%agent end to end: real Jupyter server + broker + runtime, FakeAnthropic as the model, a real kernel.

The model proposes a write (the kernel tool ``run_code``); the card appears; a click decides whether the
file gets written. Clicks are sent as the comm messages a browser sends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

from .conftest import execute, text_of
from .real_server import RealServer

pytestmark = pytest.mark.slow
MODEL = "claude-fake-1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealServer, FakeAnthropic, Any]]:
    with FakeAnthropic(api_key="test-key") as fake:
        tmp = tmp_path_factory.mktemp("e2e")
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "default_model": MODEL}
        with RealServer(tmp, config) as srv:
            kc = srv.kernel_for("e2e.ipynb")
            assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
            yield srv, fake, kc


def clicker(kc: Any, label: str) -> tuple[Any, list[str]]:
    clicked: list[str] = []

    def observe(msg: dict[str, Any]) -> None:
        if msg["msg_type"] != "comm_open" or clicked:
            return
        state = msg["content"]["data"].get("state", {})
        if state.get("_model_name") == "ButtonModel" and state.get("description") == label:
            clicked.append(msg["content"]["comm_id"])
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": msg["content"]["comm_id"], "data": {
                "method": "custom", "content": {"event": "click"}}}))

    return observe, clicked


def test_first_cell_connects_then_streams(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    _, fake, kc = stack
    fake.enqueue(Reply(text("Hello from the **fake** model.")))
    observe, clicked = clicker(kc, "Connect")
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nsay hello", on_iopub=observe, timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    assert clicked, "the connect card did not appear"
    assert "Hello from the **fake** model." in text_of(msgs)
    assert fake.saw_api_key("test-key")


def _write_turn(fake: FakeAnthropic, name: str) -> None:
    fake.enqueue(Reply(text("I will write the file."),
                       tool_use("run_code", {"code": f"open({name!r}, 'w').write('approved')"})))
    fake.enqueue(Reply(text("Finished.")))


def test_approve_writes_the_file(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, kc = stack
    _write_turn(fake, "approved.txt")
    observe, clicked = clicker(kc, "Approve")
    reply, msgs = execute(kc, "%%agent\nwrite approved.txt", on_iopub=observe, timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    assert clicked and (srv.root / "approved.txt").read_text() == "approved"
    assert "Finished." in text_of(msgs) and "run_code" in text_of(msgs)


def test_deny_leaves_the_file_absent(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, kc = stack
    _write_turn(fake, "denied.txt")
    observe, clicked = clicker(kc, "Deny")
    reply, msgs = execute(kc, "%%agent\nwrite denied.txt", on_iopub=observe, timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    assert clicked and not (srv.root / "denied.txt").exists()
    # the model was told: the next request carries the refusal as the tool result
    last = fake.requests[-1].body["messages"][-1]["content"]
    assert any(b.get("type") == "tool_result" and b.get("is_error") for b in last if isinstance(b, dict))


def test_headless_denies_a_write(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    srv, fake, kc = stack
    _write_turn(fake, "headless.txt")
    reply, msgs = execute(kc, "%%agent\nwrite headless.txt", allow_stdin=False, timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    assert not (srv.root / "headless.txt").exists()


def test_read_tool_runs_without_a_card(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    _, fake, kc = stack
    execute(kc, "import pandas as pd\nsales = pd.DataFrame({'q': [1, 2], 'v': [3.5, 4.5]})")
    fake.enqueue(Reply(tool_use("describe_dataframe", {"name": "sales"})))
    fake.enqueue(Reply(text("It has two rows.")))
    reply, msgs = execute(kc, "%%agent --var sales\ndescribe sales", timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    assert "It has two rows." in text_of(msgs)
    body = str(fake.requests[-1].body["messages"])
    assert "shape=(2, 2)" in body and "kernel variable sales" in body


def test_hostile_answer_renders_escaped(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    _, fake, kc = stack
    fake.enqueue(Reply(text('<script>alert(1)</script><img src=x onerror=alert(2)> [x](javascript:alert(3))')))
    reply, msgs = execute(kc, "%%agent\nbe hostile", timeout=60)
    assert reply["status"] == "ok"
    html = "".join(m["content"]["data"].get("text/html", "") for m in msgs
                   if m["msg_type"] in ("display_data", "update_display_data"))
    assert "<script" not in html and "<img" not in html and 'href="javascript' not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "x](javascript:alert(3))" in text_of(msgs)


def test_unknown_model_fails_with_one_line(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    _, _, kc = stack
    reply, msgs = execute(kc, "%%agent --model not-granted-model\nhi", timeout=60)
    assert reply["status"] == "error"
    (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(tb) == 1, tb


def test_rerunning_an_earlier_cell_forks_the_conversation(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    _, fake, kc = stack
    for cell, prompt in (("cell-1", "first question"), ("cell-2", "second question"), ("cell-1", "first again")):
        fake.enqueue(Reply(text(f"answer to {prompt}")))
        reply, msgs = execute(kc, f"%%agent --chat forked\n{prompt}", cell_id=cell, timeout=60)
        assert reply["status"] == "ok", text_of(msgs)
    sent = str(fake.requests[-1].body["messages"])
    # the re-run replaced turn 0 and everything after it: only the new prompt is in the history
    assert "first again" in sent and "first question" not in sent and "second question" not in sent
    fake.enqueue(Reply(text("continued")))
    execute(kc, "%%agent --chat forked\nthird", cell_id="cell-3", timeout=60)
    sent = str(fake.requests[-1].body["messages"])
    assert "first again" in sent and "answer to first again" in sent and "third" in sent


def test_budget_and_run_views_match_the_broker(stack: tuple[RealServer, FakeAnthropic, Any]) -> None:
    # relay.budget() and relay.run(id) read budget.get / runs.get as the real broker answers them
    # (before: "no limit" and 0 requests whatever the grant said; model "?" and no times)
    import re

    srv, fake, _ = stack
    kc = srv.kernel_for("views.ipynb")
    assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
    reply, msgs = execute(kc, "relay.connect(['*'], budget={'tokens_per_day': 50000, 'cost_per_day_usd': 2.5, "
                              "'requests_per_minute': 40})")
    assert reply["status"] == "ok", text_of(msgs)
    fake.enqueue(Reply(tool_use("list_variables", {})))
    fake.enqueue(Reply(text("Listed.")))
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nlist my variables", timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    run_id = re.search(r"run `(run_[0-9a-f]+)`", text_of(msgs)).group(1)  # type: ignore[union-attr]
    reply, msgs = execute(kc, f"print(relay.run({run_id!r}).text())")
    shown = text_of(msgs)
    assert f"model {MODEL} (anthropic)" in shown, shown
    assert re.search(r"2 model steps, started [0-9-]+ [0-9:]+, took \d+\.\d s", shown), shown
    # this server keeps its journal in memory (no per-call rows); tool rows are tested in test_widgets.py
    reply, msgs = execute(kc, "relay.budget()")
    shown = text_of(msgs)
    tokens = re.search(r"tokens today: (\d+) / 50000 tokens", shown)
    assert tokens and int(tokens.group(1)) > 0, shown
    assert "/ 2.5 USD" in shown
    requests = re.search(r"requests in the last minute: (\d+) / 40 req", shown)
    assert requests and int(requests.group(1)) >= 2, shown  # two model requests in this run
