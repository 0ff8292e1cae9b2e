"""The demo backend: deterministic scripts, every text marked as a demo, tool calls by step."""

import pytest

from relay_jupyter.backends.base import Stop, TextDelta, ToolCallDone, UsageEvent
from relay_jupyter.backends.demo import DEMO_MODEL, DemoBackend
from relay_jupyter.core.types import ToolClass, ToolSpec

TOOLS = [ToolSpec(name=n, tool_class=ToolClass.READ) for n in
         ("list_variables", "describe_dataframe", "scratch_write", "scratch_edit", "scratch_push",
          "propose_cell", "time__get_current_time")]


async def turn(messages, tools=TOOLS):
    events = [e async for e in DemoBackend(delay=0).stream_turn(DEMO_MODEL, "", messages, tools, 1000)]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [e for e in events if isinstance(e, ToolCallDone)]
    assert isinstance(events[-1], Stop) and isinstance(events[-2], UsageEvent)
    return text, calls, events[-1].reason


def user(text):
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def assistant_call(call):
    return {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name,
                                              "input": call.input}]}


def result(call, content, is_error=False):
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": content,
                                         "is_error": is_error}]}


def test_model_allowlist():
    backend = DemoBackend()
    assert backend.allows_model("demo") and not backend.allows_model("claude-sonnet-4-5")


@pytest.mark.asyncio
async def test_default_answer_says_it_is_a_demo_and_how_to_configure():
    text, calls, stop = await turn([user("hello there")])
    assert text.startswith("**[demo]**") and "ANTHROPIC_API_KEY" in text
    assert calls == [] and stop == "end_turn"


@pytest.mark.asyncio
async def test_scratch_script_walks_write_edit_push_and_reports_a_denial():
    history = [user("write a cleaning script to a file")]
    names = []
    for _ in range(3):
        text, calls, stop = await turn(history)
        assert text.startswith("**[demo]**") and stop == "tool_use"
        names.append(calls[0].name)
        history += [assistant_call(calls[0]), result(calls[0], "ok")]
    assert names == ["scratch_write", "scratch_edit", "scratch_push"]
    history[-1] = result(calls[0], "CONSENT_DENIED: the user denied this action", is_error=True)
    text, calls, stop = await turn(history)
    assert "refused" in text and "CONSENT_DENIED" in text and calls == [] and stop == "end_turn"


@pytest.mark.asyncio
async def test_dataframe_script_uses_the_listed_name():
    history = [user("describe my dataframes")]
    _, calls, _ = await turn(history)
    history += [assistant_call(calls[0]), result(calls[0], "x: int\nsales: DataFrame shape=(3, 2)")]
    _, calls, _ = await turn(history)
    assert calls[0].name == "describe_dataframe" and calls[0].input == {"name": "sales"}


@pytest.mark.asyncio
async def test_a_tool_outside_the_grant_is_named_not_called():
    text, calls, _ = await turn([user("what time is it")], tools=[])
    assert calls == [] and "time__get_current_time" in text and "[demo]" in text
