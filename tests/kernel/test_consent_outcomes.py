"""Consent outcomes in a real kernel (scripted broker): a broker timeout fails the cell with one
PERMISSION_TIMEOUT line and the card says so; a withdrawn request disables the card; the card offers only
the scopes the broker allows and shows run_code's code; full mode says so at the top of the cell."""

from __future__ import annotations

from typing import Any

from .conftest import execute, text_of
from .fake_broker import FakeBroker


def _buttons(msgs: list[dict[str, Any]]) -> dict[str, str]:
    """comm id -> description of every Button the cell opened."""
    return {m["content"]["comm_id"]: m["content"]["data"]["state"].get("description", "") for m in msgs
            if m["msg_type"] == "comm_open" and m["content"]["data"].get("state", {}).get("_model_name")
            == "ButtonModel"}


def _disabled(msgs: list[dict[str, Any]]) -> set[str]:
    """comm ids of widgets the kernel disabled."""
    return {m["content"]["comm_id"] for m in msgs if m["msg_type"] == "comm_msg"
            and m["content"]["data"].get("method") == "update"
            and m["content"]["data"].get("state", {}).get("disabled") is True}


def _errors(msgs: list[dict[str, Any]]) -> list[list[str]]:
    return [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]


def test_broker_timeout_marks_the_card_and_fails_the_cell(kernel: Any, broker: FakeBroker) -> None:
    # the broker's order: permission_timeout, then one permission.resolved; the run then ends run.done
    broker.script([("permission", {"tool": "write_file", "arguments": {}}, {"timeout_after": 0.5}),
                   ("text", "carried on after the timeout")])
    seen: list[dict[str, Any]] = []
    answers = len(broker.answers)
    reply, msgs = execute(kernel, "%%agent\nwrite", on_iopub=seen.append, timeout=30)
    assert reply["status"] == "error", text_of(msgs)
    (tb,) = _errors(msgs)
    assert len(tb) == 1 and "write_file timed out and was denied [PERMISSION_TIMEOUT]" in tb[0], tb
    assert "Timed out — denied" in text_of(msgs) and "Cancelled" not in text_of(msgs)
    assert "carried on after the timeout" in text_of(msgs) and "✓" in text_of(msgs)
    assert set(_buttons(msgs)) <= _disabled(msgs)  # every button of the card is disabled
    assert len(broker.answers) == answers  # the kernel did not answer an ended request


def test_legacy_cancel_then_gate_timeout_still_fails_the_cell(kernel: Any, broker: FakeBroker) -> None:
    # before issue 11 the broker said "cancelled" and only the step carried PERMISSION_TIMEOUT: the cell
    # was green; the step's code alone now marks the card and fails the cell
    broker.script([("permission", {"tool": "write_file", "arguments": {}}, {"legacy_timeout_after": 0.5}),
                   ("text", "done anyway")])
    reply, msgs = execute(kernel, "%%agent\nwrite", timeout=30)
    assert reply["status"] == "error", text_of(msgs)
    (tb,) = _errors(msgs)
    assert len(tb) == 1 and "PERMISSION_TIMEOUT" in tb[0]
    assert "Timed out — denied" in text_of(msgs)


def test_withdrawn_request_disables_the_card(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("permission", {"tool": "write_file", "arguments": {}}, {"withdraw_after": 0.5})])
    reply, msgs = execute(kernel, "%%agent\nwrite", timeout=30)
    assert reply["status"] == "error"
    assert "Withdrawn at" in text_of(msgs)
    buttons = _buttons(msgs)
    assert buttons and set(buttons) <= _disabled(msgs)
    (tb,) = _errors(msgs)
    assert "cancelled" in tb[0] and "PERMISSION_TIMEOUT" not in tb[0]


def test_run_code_card_offers_once_only_and_shows_the_code(kernel: Any, broker: FakeBroker) -> None:
    code = "import os\nos.remove('notes.txt')  # <img src=x onerror=alert(1)>"
    broker.script([("permission", {"tool": "run_code", "arguments": {"code": code}, "scopes": ["once"]},
                    {"timeout_after": 0.5})])
    reply, msgs = execute(kernel, "%%agent\nrun it", timeout=30)
    descriptions = sorted(_buttons(msgs).values())
    assert descriptions == ["Approve", "Deny"], descriptions
    html = "".join(str(m["content"]["data"].get("state", {}).get("value", "")) for m in msgs
                   if m["msg_type"] == "comm_open")
    assert "os.remove('notes.txt')  # &lt;img src=x onerror=alert(1)&gt;" in html and "<img" not in html
    assert "os.remove('notes.txt')  # <img src=x onerror=alert(1)>" in text_of(msgs)  # the text fallback
    assert reply["status"] == "error"


def test_all_scopes_are_offered_when_the_broker_names_none(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("permission", {"tool": "write_file", "arguments": {}}, {"timeout_after": 0.5})])
    _, msgs = execute(kernel, "%%agent\nwrite", timeout=30)
    assert sorted(_buttons(msgs).values()) == ["Allow for this run", "Always allow for this notebook", "Approve",
                                               "Deny"]


def test_full_mode_says_so_at_the_top_of_the_cell(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("text", "ran everything")])
    reply, msgs = execute(kernel, "%%agent --mode full\ngo")
    assert reply["status"] == "ok"
    shown = text_of(msgs)
    assert "full mode" in shown and "without asking you" in shown
    assert shown.index("full mode") < shown.index("ran everything")
    broker.script([("text", "asked")])
    _, msgs = execute(kernel, "%%agent\ngo")
    assert "full mode" not in text_of(msgs)
    broker.script([("text", "headless too")])  # nbclient / nbval: a printed line, first
    _, msgs = execute(kernel, "%%agent --mode full\ngo", allow_stdin=False)
    shown = text_of(msgs)
    assert "relay: ⚠ full mode" in shown and shown.index("full mode") < shown.index("headless too")


def test_an_answer_that_lost_the_race_with_the_deadline_still_fails_the_cell(kernel: Any,
                                                                              broker: FakeBroker) -> None:
    # the headless policy answers at once, but the broker's deadline won: its permission_timeout (which
    # names only the request id) is matched to the call, and the cell fails rather than ending green
    broker.script([("permission", {"tool": "write_file", "arguments": {}}, {"late_timeout": True}),
                   ("text", "after the race")])
    reply, msgs = execute(kernel, "%%agent\nwrite", allow_stdin=False, timeout=30)
    assert reply["status"] == "error", text_of(msgs)
    (tb,) = _errors(msgs)
    assert len(tb) == 1 and "write_file timed out and was denied [PERMISSION_TIMEOUT]" in tb[0], tb
    assert "after the race" in text_of(msgs)
