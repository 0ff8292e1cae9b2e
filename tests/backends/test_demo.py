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


@pytest.mark.asyncio
async def test_call_ids_are_unique_across_runs_of_one_conversation():
    # a later run of the same conversation repeats step 0; a reused id would pair with the old result
    _, first, _ = await turn([user("describe my dataframes")])
    _, second, _ = await turn([user("describe my dataframes")])
    assert first[0].id != second[0].id


@pytest.mark.asyncio
async def test_every_text_of_every_script_says_demo():
    prompts = ["hello", "describe my dataframes", "write a cleaning script to a file", "what time is it",
               "propose a code cell"]
    for prompt in prompts:
        history = [user(prompt)]
        for _ in range(5):
            text, calls, stop = await turn(history)
            assert text.startswith("**[demo]**"), (prompt, text)
            if stop == "end_turn":
                assert "demo" in text and ("ANTHROPIC_API_KEY" in text or "connect" in text), (prompt, text)
                break
            history += [assistant_call(calls[0]), result(calls[0], "sales: DataFrame shape=(2, 2)")]
        else:
            raise AssertionError(f"{prompt!r} never ended")


# -- the broker picks the demo only when nothing real is configured (broker/assembly.py) ------------

def _assembled(tmp_path, monkeypatch, **config):
    from relay_jupyter.broker.assembly import install_components
    from relay_jupyter.broker.broker import Broker
    from relay_jupyter.broker.config import BrokerConfig

    for name in ("ANTHROPIC_API_KEY", "RELAY_ANTHROPIC_API_KEY", "OPENAI_API_KEY", "RELAY_OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    broker = Broker.open(BrokerConfig(in_memory=True, **config))
    install_components(broker, jupyter_root=tmp_path)
    return broker


def test_without_a_backend_the_demo_is_installed_and_is_the_default(tmp_path, monkeypatch):
    broker = _assembled(tmp_path, monkeypatch)
    try:
        assert set(broker.runs.backends) == {"demo"}
        assert broker.config.default_backend == "demo" and broker.config.default_model == DEMO_MODEL
    finally:
        broker.close()


def test_with_an_anthropic_key_the_demo_is_not_installed(tmp_path, monkeypatch):
    broker = _assembled(tmp_path, monkeypatch, anthropic_api_key="sk-ant-test-not-real")
    try:
        assert "demo" not in broker.runs.backends and "anthropic" in broker.runs.backends
        assert broker.config.default_backend == "anthropic"
    finally:
        broker.close()


def test_with_a_key_in_the_server_environment_the_demo_is_not_installed(tmp_path, monkeypatch):
    from relay_jupyter.broker.assembly import install_components
    from relay_jupyter.broker.broker import Broker
    from relay_jupyter.broker.config import BrokerConfig

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-real")
    broker = Broker.open(BrokerConfig(in_memory=True))
    try:
        install_components(broker, jupyter_root=tmp_path)
        assert "demo" not in broker.runs.backends
    finally:
        broker.close()


def test_with_a_local_openai_server_the_demo_is_not_installed(tmp_path, monkeypatch):
    broker = _assembled(tmp_path, monkeypatch, openai_base_url="http://127.0.0.1:9/v1",
                        default_backend="openai")
    try:
        assert set(broker.runs.backends) == {"openai"} and broker.config.default_backend == "openai"
    finally:
        broker.close()


# -- issue 13 item 5: answers by the question, with the kernel's real variables, and run_code --------------
RUN_TOOLS = TOOLS + [ToolSpec(name="run_code", tool_class=ToolClass.WRITE)]
SUMMARY = ("sales: pandas.DataFrame shape=(3, 3)\ndtypes:\nmonth        int64\nrevenue    float64\n"
           "region         str\nhead:\n   month  revenue region\n0      1     10.0      a\n")


@pytest.mark.asyncio
async def test_a_question_it_does_not_know_is_answered_plainly():
    for prompt in ("What is the capital of France?", "Summarise the paper in refs.bib", "why is my model slow"):
        text, calls, stop = await turn([user(prompt)])
        assert text.startswith("**[demo]** I can't answer that") and "ANTHROPIC_API_KEY" in text, (prompt, text)
        assert calls == [] and stop == "end_turn"
    text, _, _ = await turn([user("Hello! What can you do?")])
    assert text.startswith("**[demo]** Hello!")


@pytest.mark.asyncio
async def test_plot_lists_describes_and_runs_code_on_the_real_dataframe_and_column():
    history = [user("Load sales.csv and plot monthly revenue")]
    _, calls, _ = await turn(history, RUN_TOOLS)
    assert calls[0].name == "list_variables"
    history += [assistant_call(calls[0]), result(calls[0], "x: int\nsales: DataFrame shape=(3, 3)")]
    _, calls, _ = await turn(history, RUN_TOOLS)
    assert calls[0].name == "describe_dataframe" and calls[0].input == {"name": "sales"}
    history += [assistant_call(calls[0]), result(calls[0], SUMMARY)]
    text, calls, stop = await turn(history, RUN_TOOLS)
    assert calls[0].name == "run_code" and stop == "tool_use"
    assert "sales['revenue'].plot(" in calls[0].input["code"] and "card shows the exact code" in text
    history += [assistant_call(calls[0]), result(calls[0], "CONSENT_DENIED: the user denied", is_error=True)]
    text, calls, stop = await turn(history, RUN_TOOLS)
    assert "did not run" in text and "CONSENT_DENIED" in text and calls == []
    # no DataFrame in the kernel: said plainly, nothing made up
    history = [user("plot revenue")]
    _, calls, _ = await turn(history, RUN_TOOLS)
    history += [assistant_call(calls[0]), result(calls[0], "x: int")]
    text, calls, _ = await turn(history, RUN_TOOLS)
    assert calls == [] and "no DataFrame" in text


@pytest.mark.asyncio
async def test_run_code_script_and_the_proposed_cell_work_in_any_notebook():
    text, calls, _ = await turn([user("Run code that summarises my data")], RUN_TOOLS)
    assert calls[0].name == "run_code" and "isinstance(value, pd.DataFrame)" in calls[0].input["code"]
    compile(calls[0].input["code"], "<demo>", "exec")
    _, calls, _ = await turn([user("Propose a code cell that summarises my data.")], RUN_TOOLS)
    assert calls[0].name == "propose_cell"
    code = calls[0].input["code"]
    assert "df.describe()" not in code and "no DataFrame in this notebook yet" in code  # no made-up `df`
    compile(code, "<demo>", "exec")
    # running the proposed cell where there is no DataFrame says so instead of a NameError
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"display": print})  # noqa: S102 -- the demo's own constant code
    assert "no DataFrame in this notebook yet" in out.getvalue()
    text, calls, _ = await turn([user("Run code")], TOOLS)  # run_code not granted: named, not called
    assert calls == [] and "run_code" in text


@pytest.mark.asyncio
async def test_describe_shows_the_whole_summary_not_up_to_head():
    history = [user("Describe the DataFrames in my kernel.")]
    _, calls, _ = await turn(history)
    history += [assistant_call(calls[0]), result(calls[0], "sales: DataFrame shape=(3, 3)")]
    _, calls, _ = await turn(history)
    history += [assistant_call(calls[0]), result(calls[0], SUMMARY)]
    text, calls, _ = await turn(history)
    assert "0      1     10.0      a" in text and "revenue    float64" in text
