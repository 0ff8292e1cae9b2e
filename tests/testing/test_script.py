"""The reply script: block helpers, Reply options, the awkward JSON splitter, the thread-safe queue."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_jupyter.testing import ErrorReply, Reply, TextBlock, ToolUseBlock, Usage, text, tool_use
from relay_jupyter.testing.script import DEFAULT_TEXT, Script, split_json, split_text

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(), json_values, max_size=5))
def test_split_json_pieces_join_back_to_the_document(value):
    pieces = split_json(value)
    assert pieces[0] == ""
    assert "".join(pieces) == json.dumps(value, ensure_ascii=True)
    assert json.loads("".join(pieces)) == value


def test_split_json_cuts_at_the_awkward_places():
    pieces = split_json({"k\u00e9y": 'a "quoted"\nline'})
    assert any(p.endswith("\\") for p in pieces)  # between backslash and escaped char
    assert any(p.startswith(("00e9", "u00")) for p in pieces)  # inside \u00e9
    assert any(p.startswith(":") for p in pieces)  # between key and colon


@given(st.text(max_size=200), st.integers(min_value=1, max_value=5))
def test_split_text_preserves_text(value, chunk):
    pieces = split_text(value, chunk)
    assert "".join(pieces) == value
    if len(value) > 1:
        assert len(pieces) >= 2


def test_reply_forms_and_defaults():
    assert Reply("a", text("b")).blocks == (TextBlock("a"), TextBlock("b"))
    assert Reply([text("a"), "b"]).blocks == Reply(text("a"), "b").blocks
    assert Reply("x").final_stop_reason == "end_turn"
    assert Reply(tool_use("t", {})).final_stop_reason == "tool_use"
    assert Reply("x", stop_reason="max_tokens").final_stop_reason == "max_tokens"
    assert Reply("one two three").output_tokens() == 3
    assert Reply().output_tokens() == 1
    assert Reply("x", usage=Usage(output_tokens=40)).output_tokens() == 40
    assert tool_use("t").input == {} and tool_use("t").id.startswith("toolu_")
    assert tool_use("t", id="toolu_x").id == "toolu_x"


@pytest.mark.parametrize(
    ("make", "exc"),
    [
        (lambda: Reply(42), TypeError),
        (lambda: Reply("x", colour="red"), TypeError),
        (lambda: Reply("x", chunk_tokens=0), ValueError),
        (lambda: Reply("x", tokens_per_second=0), ValueError),
        (lambda: text(3), TypeError),
        (lambda: tool_use("t", ["not", "a", "dict"]), TypeError),
        (lambda: tool_use("t", {"x": object()}), TypeError),
    ],
)
def test_bad_scripting_fails_at_scripting_time(make, exc):
    with pytest.raises(exc):
        make()


def test_script_queue_is_fifo_with_default_and_thread_safe():
    script = Script()
    assert script.pop().blocks == (TextBlock(DEFAULT_TEXT),)
    script.push("a")
    script.push([text("b"), tool_use("t", {}, id="i")])
    script.push(ErrorReply(500))
    assert script.pending() == 3
    assert script.pop().blocks == (TextBlock("a"),)
    assert isinstance(script.pop().blocks[1], ToolUseBlock)
    assert isinstance(script.pop(), ErrorReply)
    with pytest.raises(TypeError):
        script.push(3.5)

    def pusher():
        for _ in range(500):
            script.push("x")

    threads = [threading.Thread(target=pusher) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert script.pending() == 2000
    script.clear()
    assert script.pending() == 0
