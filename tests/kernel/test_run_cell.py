"""A %%agent cell in a real kernel against the scripted broker: streaming, errors, consent, tools."""

from __future__ import annotations

import json
from typing import Any

from relay_jupyter.kernel.rendering import CHROME_TAGS

from .conftest import execute, text_of
from .fake_broker import FakeBroker
from .test_rendering import CHROME_ATTRS, assert_allowlisted


def test_cell_streams_answer_as_markdown_and_succeeds(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("texts", ["Hello ", "**world**.", "\n\nSecond ", "paragraph."])])
    reply, msgs = execute(kernel, "%%agent --model m1\nsay hello")
    assert reply["status"] == "ok"
    assert "Hello **world**." in text_of(msgs)
    assert "Second paragraph." in text_of(msgs)
    start = [p for m, p in broker.calls if m == "run.start"][-1]
    assert start["prompt"] == "say hello" and start["model"] == "m1" and start["conversation"] == "default"
    # X-Relay-Client: this test kernel knows no notebook path, so it names itself (never the shared "kernel")
    assert broker.clients and all(c.startswith("kernel:anon-") for c in broker.clients), broker.clients


def test_run_error_fails_the_cell_with_one_line(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("text", "partial"), ("end", "run.error", {"code": "NO_CREDENTIALS", "message": "no API key"})])
    reply, msgs = execute(kernel, "%%agent\nhi")
    assert reply["status"] == "error"
    errors = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(errors) == 1 and len(errors[0]) == 1
    assert "no API key [NO_CREDENTIALS]" in errors[0][0]


def test_refused_start_fails_with_one_line(kernel: Any, broker: FakeBroker) -> None:
    broker.refuse_start = ("MODEL_NOT_ALLOWED", "model gpt-x is not allowed")
    try:
        reply, msgs = execute(kernel, "%%agent --model gpt-x\nhi")
    finally:
        broker.refuse_start = None
    assert reply["status"] == "error"
    (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(tb) == 1 and "MODEL_NOT_ALLOWED" in tb[0]


def test_budget_exhausted_fails_the_cell(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("end", "run.budget_exhausted", {"message": "daily token budget used"})])
    reply, msgs = execute(kernel, "%%agent\nhi")
    assert reply["status"] == "error"
    assert "BUDGET_EXCEEDED" in text_of(msgs)


def test_bad_options_give_one_line(kernel: Any) -> None:
    reply, msgs = execute(kernel, "%%agent --mode sideways\nhi")
    assert reply["status"] == "error"
    (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(tb) == 1 and "invalid choice" in tb[0]


def _comm_opens(msgs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["content"]["comm_id"]: m["content"]["data"]["state"] for m in msgs
            if m["msg_type"] == "comm_open" and m["content"].get("target_name") == "jupyter.widget"}


def _click_when_card_appears(kernel: Any, label: str) -> Any:
    """An iopub observer that clicks ``label`` the way a browser does, once the button exists."""
    clicked: list[str] = []

    def observe(msg: dict[str, Any]) -> None:
        if clicked or msg["msg_type"] != "comm_open":
            return
        state = msg["content"]["data"].get("state", {})
        if state.get("_model_name") == "ButtonModel" and state.get("description") == label:
            comm_id = msg["content"]["comm_id"]
            clicked.append(comm_id)
            content = {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}}
            kernel.shell_channel.send(kernel.session.msg("comm_msg", content))

    return observe, clicked


def test_click_approve_arrives_while_the_cell_runs(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("text", "I will write a file.\n\n"),
                   ("permission", {"tool": "write_file", "arguments": {"path": "a.txt", "text": "<b>x</b>"}}),
                   ("text", "Done writing.")])
    observe, clicked = _click_when_card_appears(kernel, "Approve")
    seen: list[dict[str, Any]] = []
    reply, msgs = execute(kernel, "%%agent\nwrite a.txt", on_iopub=lambda m: (seen.append(m), observe(m)))
    assert reply["status"] == "ok", text_of(msgs)
    assert clicked
    assert broker.answers[-1]["decision"] == "allow" and broker.answers[-1]["scope"] == "once"
    text = text_of(msgs)
    assert "Done writing." in text
    # the card's text fallback says who answered, and its buttons end disabled
    # (the update is a reply to the click's comm_msg, so its parent is that message, not the cell)
    assert "Approved by you (click)" in text_of(seen)
    disabled = [m for m in seen if m["msg_type"] == "comm_msg"
                and m["content"]["data"].get("state", {}).get("disabled") is True]
    assert len(disabled) >= 4


def test_click_always_allow_sends_notebook_scope(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("permission", {"tool": "write_file", "arguments": {}})])
    observe, clicked = _click_when_card_appears(kernel, "Always allow for this notebook")
    reply, _ = execute(kernel, "%%agent\nwrite", on_iopub=observe)
    assert reply["status"] == "ok" and clicked
    assert broker.answers[-1] == {"request_id": broker.answers[-1]["request_id"], "decision": "allow",
                                  "scope": "notebook"}


def test_headless_denies_without_asking(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("permission", {"tool": "write_file", "arguments": {"path": "x"}}), ("text", "ok")])
    reply, msgs = execute(kernel, "%%agent\nwrite", allow_stdin=False)
    assert reply["status"] == "ok"
    assert broker.answers[-1]["decision"] == "deny"
    assert not _comm_opens(msgs)  # no card in headless mode
    assert "deny write_file (headless, policy:deny)" in text_of(msgs)


def test_headless_allowlist_from_config(kernel: Any, broker: FakeBroker) -> None:
    execute(kernel, "%config AgentMagics.headless_policy = 'allowlist'\n"
                    "%config AgentMagics.headless_allowlist = ['propose_cell']")
    try:
        broker.script([("permission", {"tool": "propose_cell", "arguments": {}}),
                       ("permission", {"tool": "write_file", "arguments": {}})])
        reply, _ = execute(kernel, "%%agent\ngo", allow_stdin=False)
        assert reply["status"] == "ok"
        assert [a["decision"] for a in broker.answers[-2:]] == ["allow", "deny"]
    finally:
        execute(kernel, "%config AgentMagics.headless_policy = 'deny'")


def test_card_timeout_denies_and_fails_the_cell(kernel: Any, broker: FakeBroker) -> None:
    execute(kernel, "%config AgentMagics.consent_timeout = 1.0")
    try:
        broker.script([("permission", {"tool": "write_file", "arguments": {}}), ("text", "after")])
        reply, msgs = execute(kernel, "%%agent\nwrite")
    finally:
        execute(kernel, "%config AgentMagics.consent_timeout = 300.0")
    assert broker.answers[-1]["decision"] == "deny"
    assert reply["status"] == "error"
    (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(tb) == 1 and "timed out and was denied [PERMISSION_TIMEOUT]" in tb[0], tb
    assert "Timed out — denied" in text_of(msgs)  # the card's text fallback
    assert "after" in text_of(msgs)  # the run went on (the tool was denied), and still the cell failed


def test_kernel_tools_run_in_the_kernel(kernel: Any, broker: FakeBroker) -> None:
    execute(kernel, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})\nzz = 41")
    broker.script([("kernel_tool", "list_variables", {}), ("kernel_tool", "describe_dataframe", {"name": "df"}),
                   ("kernel_tool", "run_code", {"code": "print(zz + 1)\nzz * 2"}),
                   ("kernel_tool", "describe_dataframe", {"name": "zz"}),
                   ("kernel_tool", "propose_cell", {"code": "df.plot()"})])
    reply, _ = execute(kernel, "%%agent\nlook")
    assert reply["status"] == "ok"
    results = broker.tool_results[-5:]
    assert "df: DataFrame shape=(3, 2)" in results[0]["content"] and "zz: int" in results[0]["content"]
    assert "shape=(3, 2)" in results[1]["content"] and "describe:" in results[1]["content"]
    assert "42" in results[2]["content"] and "82" in results[2]["content"] and not results[2]["is_error"]
    assert results[3]["is_error"] and "not a pandas DataFrame" in results[3]["content"]
    payloads = reply.get("payload", [])
    assert any(p.get("source") == "set_next_input" and p.get("text") == "df.plot()" for p in payloads)


def test_var_attaches_labeled_summary(kernel: Any, broker: FakeBroker) -> None:
    execute(kernel, "secret_df = [1, 2, 3]")
    broker.script([("text", "ok")])
    reply, _ = execute(kernel, "%%agent --var secret_df\nexplain")
    assert reply["status"] == "ok"
    start = [p for m, p in broker.calls if m == "run.start"][-1]
    (att,) = start["attachments"]
    assert att["label"] == "kernel variable secret_df" and "[1, 2, 3]" in att["content"]
    reply, msgs = execute(kernel, "%%agent --var nope\nexplain")
    assert reply["status"] == "error" and "no such variable" in text_of(msgs)


def test_chat_new_and_fork_on_rerun(kernel: Any, broker: FakeBroker) -> None:
    for cell in ("cell-a", "cell-b", "cell-a"):
        broker.script([("text", "ok")])
        reply, _ = execute(kernel, f"%%agent --chat fk\nq {cell}", cell_id=cell)
        assert reply["status"] == "ok"
    # each run.start names its cell; the broker forks at that cell's turn (it stores each turn's cell id), so
    # the kernel no longer forks from what it remembers (a restarted kernel remembers nothing)
    starts = [p for m, p in broker.calls if m == "run.start"][-3:]
    assert [p.get("cell_id") for p in starts] == ["cell-a", "cell-b", "cell-a"]
    assert not [p for m, p in broker.calls if m == "conversations.fork"]
    broker.script([("text", "ok")])
    execute(kernel, "%%agent --chat fk --new\nfresh", cell_id="cell-c")
    start = [p for m, p in broker.calls if m == "run.start"][-1]
    assert start["conversation"].startswith("fk-")


def test_an_older_broker_without_cell_ids_still_forks_on_rerun(kernel: Any, broker: FakeBroker) -> None:
    # a daemon still running from an install before cell ids refuses the field (-32602, extra_forbidden): the
    # cell still runs, without the field, and the kernel forks from what it remembers, as that version did
    broker.takes_cell_id = False
    try:
        before = len(broker.calls)
        for cell in ("old-a", "old-b", "old-a"):
            broker.script([("text", "ok")])
            reply, msgs = execute(kernel, f"%%agent --chat old\nq {cell}", cell_id=cell)
            assert reply["status"] == "ok", text_of(msgs)
        calls = [(m, p) for m, p in broker.calls[before:] if m in ("run.start", "conversations.fork")]
        # the first run.start is refused and retried without the field; the kernel then stops sending it
        assert [m for m, _ in calls] == ["run.start", "run.start", "run.start", "conversations.fork", "run.start"], calls
        assert [p.get("cell_id") for m, p in calls if m == "run.start"] == ["old-a", None, None, None]
        assert calls[3][1] == {"conversation": "old", "at_turn": 0}
    finally:
        broker.takes_cell_id = True
        execute(kernel, "relay._session.broker_lacks_cell_ids = False")  # the module's kernel goes on


def test_hostile_answer_is_escaped(kernel: Any, broker: FakeBroker) -> None:
    hostile = ('<script>alert(1)</script> <img src=x onerror="alert(2)"> [click](javascript:alert(3))\n\n'
               "`<b>code</b>` done")
    broker.script([("text", hostile)])
    reply, msgs = execute(kernel, "%%agent\nbe evil")
    assert reply["status"] == "ok"
    outputs = [m["content"]["data"] for m in msgs if m["msg_type"] in ("display_data", "update_display_data")]
    html = "\n".join(d.get("text/html", "") for d in outputs)
    assert "text/markdown" not in str(outputs)  # JupyterLab renders text/markdown unsanitised: never sent
    assert "<script" not in html and "<img" not in html and "javascript:" not in html.replace(
        "](javascript:alert(3))", "")  # the refused link stays visible as text, never as an href
    for output in outputs:  # every tag and attribute the browser would see is in the allowlist
        assert_allowlisted(output.get("text/html", ""), CHROME_TAGS, CHROME_ATTRS)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<code>&lt;b&gt;code&lt;/b&gt;</code>" in html
    final = [d for d in outputs if "text/plain" in d]
    assert any("`<b>code</b>` done" in d["text/plain"] for d in final)  # the raw text is the fallback
    json.dumps(outputs)


def test_answer_from_elsewhere_updates_the_card_and_the_run_goes_on(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("permission", {"tool": "write_file", "arguments": {}}, {"elsewhere_after": 0.5}),
                   ("text", "carried on")])
    seen: list[dict[str, Any]] = []
    answers_before = len(broker.answers)
    reply, msgs = execute(kernel, "%%agent\nwrite", on_iopub=seen.append, timeout=20)
    assert reply["status"] == "ok", text_of(msgs)
    assert "carried on" in text_of(msgs)
    assert "Approved by you in the side panel" in text_of(seen)
    assert "browser:alice" not in text_of(seen)  # a client id is not a name a person reads
    assert len(broker.answers) == answers_before  # the kernel did not answer a resolved request


def test_replayed_request_is_handled_once(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("permission", {"tool": "write_file", "arguments": {}}, {"replay": True}), ("text", "ok")])
    answers_before = len(broker.answers)
    reply, msgs = execute(kernel, "%%agent\nwrite", allow_stdin=False)
    assert reply["status"] == "ok", text_of(msgs)
    assert len(broker.answers) == answers_before + 1
