"""The ``demo`` backend: scripted conversations for people without an API key (Binder, a first try).

It is a real backend behind the same protocol as ``anthropic`` and ``openai``: its tool calls meet
the real gate, consent cards, workspace diffs and budgets. It is never chosen silently: the broker
selects it only when no real backend is configured, and every text it produces starts with
``[demo]`` and says how to configure a real one.

Scripts are picked by keywords in the latest prompt (a greeting, DataFrames, a plot, running code, files,
the time, a cell); each step looks at the previous tool result, so a denied push is reported as denied, and
what it shows or runs uses the kernel's real variables. Anything else gets a plain "I can't answer that"
with how to configure a model -- never a canned answer to a question it did not understand. Hand-written (no library fits): a few dozen lines of
deterministic replay that the documentation notebooks can rely on under nbval.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..core.types import ToolSpec
from ..core.types import Usage as TokenUsage
from .base import Stop, TextDelta, ToolCallDone, TurnEvent, UsageEvent

__all__ = ["DEMO_MODEL", "DEMO_NOTICE", "DemoBackend"]

DEMO_MODEL = "demo"
DEMO_NOTICE = (
    "This is the relay **demo** backend: a scripted replay, not a model. To use Claude, give the "
    "Jupyter server an Anthropic key (`ANTHROPIC_API_KEY` in the server's environment, "
    "`c.RelayApp.anthropic_api_key`, or the 0600 secrets file); for a local model set "
    "`c.RelayApp.openai_base_url`."
)

CANNOT = ("I can't answer that: I am a scripted demo, not a model. I can *describe the DataFrames*, *plot a "
          "column*, *run code* that summarises your data, *write a cleaning script to a file*, *propose a code "
          "cell*, or ask for *the time* (with the `mcp-server-time` MCP server configured).")

# a cell that summarises every DataFrame of the notebook, whatever they are called (none: it says so)
_SUMMARY_CELL = """import pandas as pd

frames = {name: value for name, value in globals().items()
          if isinstance(value, pd.DataFrame) and not name.startswith("_")}
for name, frame in frames.items():
    print(f"{name}: {frame.shape[0]} rows x {frame.shape[1]} columns")
    display(frame.describe(include="all"))
if not frames:
    print("no DataFrame in this notebook yet")
"""

_CHUNK = 24  # characters per streamed delta: enough deltas to show streaming, few enough to stay cheap

_DEMO_SCRIPT = '''import pandas as pd


def clean(df: pd.DataFrame) -> pd.DataFrame:
    """Drop empty rows and normalise column names."""
    df = df.dropna(how="all")
    df.columns = [c.strip().lower() for c in df.columns]
    return df
'''


def _prompt_and_step(messages: list[dict[str, Any]]) -> tuple[str, int, list[dict[str, Any]]]:
    """The latest user prompt text, how many assistant turns answered it so far, and the
    tool results of the newest user message (empty when it is a prompt)."""
    step = 0
    for msg in reversed(messages):
        content = msg.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
        if msg.get("role") == "assistant":
            step += 1
            continue
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        if texts and not any(b.get("type") == "tool_result" for b in blocks):
            return "\n".join(texts), step, []
    return "", step, []


def _last_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not messages or messages[-1].get("role") != "user":
        return []
    content = messages[-1].get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if b.get("type") == "tool_result"]


def _find(tools: Sequence[ToolSpec], *suffixes: str) -> str | None:
    for tool in tools:
        if any(tool.name == s or tool.name.endswith("__" + s) for s in suffixes):
            return tool.name
    return None


class DemoBackend:
    """Scripted replay. ``delay`` paces the deltas so a person sees the text stream in."""

    name = "demo"

    def __init__(self, *, delay: float = 0.01) -> None:
        self.delay = delay

    def allows_model(self, model: str) -> bool:
        return model == DEMO_MODEL or model.startswith(DEMO_MODEL + "-")

    async def stream_turn(self, model: str, system: str, messages: list[dict[str, Any]],
                          tools: Sequence[ToolSpec], max_tokens: int) -> AsyncIterator[TurnEvent]:
        prompt, step, _ = _prompt_and_step(messages)
        results = _last_results(messages)
        text, calls = self._script(prompt.lower(), step, results, tools)
        sent = 0
        if text:
            text = "**[demo]** " + text
            for i in range(0, len(text), _CHUNK):
                yield TextDelta(text[i:i + _CHUNK])
                sent += 1
                if self.delay:
                    await asyncio.sleep(self.delay)
        for n, (name, args) in enumerate(calls):
            # unique per call, as the real APIs' ids are: the context pipeline pairs each result with its
            # call by id, so an id reused by a later run of the same conversation would lose its result
            yield ToolCallDone(id=f"demo_{step}_{n}_{secrets.token_hex(6)}", name=name, input=args,
                               raw_size=len(json.dumps(args)))
        prompt_tokens = sum(len(json.dumps(m.get("content", ""))) for m in messages) // 4 + len(system) // 4
        yield UsageEvent(TokenUsage(input_tokens=prompt_tokens, output_tokens=max(1, len(text) // 4)))
        yield Stop("tool_use" if calls else "end_turn")

    # -- scripts --------------------------------------------------------------------------------------

    def _script(self, prompt: str, step: int, results: list[dict[str, Any]],
                tools: Sequence[ToolSpec]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        if re.search(r"^\W*(hello|hi|hey|help)\b|what can you do", prompt):
            return self._hello()
        if re.search(r"\b(plot|chart|graph|histogram|visuali[sz]e)\b", prompt):
            return self._plot(step, results, tools)
        if re.search(r"\b(run|execute|compute|calculate)\b", prompt) and not re.search(r"\bcell\b", prompt):
            return self._run(step, results, tools)
        if re.search(r"\b(data ?frames?|variables?|describe|columns?|data)\b", prompt) \
                and not re.search(r"\b(cell|files?|scripts?)\b", prompt):
            return self._dataframes(step, results, tools)
        if re.search(r"\b(files?|scripts?|scratch|diff|push|save)\b", prompt):
            return self._scratch(step, results, tools)
        if re.search(r"\b(time|clock|date)\b", prompt):
            return self._time(step, results, tools)
        if re.search(r"\b(cell|code)\b", prompt):
            return self._cell(step, results, tools)
        return (f"{CANNOT}\n\n{DEMO_NOTICE}", [])

    @staticmethod
    def _hello() -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        return (
            "Hello! I can show what relay does without a key. Try asking me to *describe the "
            "DataFrames*, to *plot a column*, to *run code* on your data, to *write a cleaning script to a "
            "file*, for *the time* (with the `mcp-server-time` MCP server configured), or to *propose a code "
            "cell*.\n\n" + DEMO_NOTICE,
            [],
        )

    @staticmethod
    def _frame_name(body: str) -> str | None:
        """The first DataFrame ``list_variables`` reported (``name: DataFrame shape=...``)."""
        match = re.search(r'"name":\s*"([^"]+)"[^{}]*"type":\s*"DataFrame"', body) or \
            re.search(r"(\w+)\s*:\s*DataFrame", body)
        return match.group(1) if match else None

    def _plot(self, step, results, tools):
        list_vars, describe, run = (_find(tools, "list_variables"), _find(tools, "describe_dataframe"),
                                    _find(tools, "run_code"))
        if step == 0:
            return ("Let me find a DataFrame to plot.", [(list_vars, {})]) if list_vars \
                else self._missing("list_variables")
        failed, body = self._outcome(results)
        if step == 1:
            name = None if failed else self._frame_name(body)
            if name is None:
                return (f"There is no DataFrame in the kernel to plot (load one first, e.g. with "
                        f"`pd.read_csv`).\n\n{DEMO_NOTICE}", [])
            if not describe:
                return self._missing("describe_dataframe")
            return (f"`{name}` is a DataFrame; reading its columns.", [(describe, {"name": name})])
        if step == 2:
            if failed:
                return (f"Describing the DataFrame failed: {body[:200]}\n\n{DEMO_NOTICE}", [])
            name = results_name(body)
            numeric = _numeric_columns(body)
            if name is None or not numeric:
                return (f"I found no numeric column to plot.\n\n{DEMO_NOTICE}", [])
            if not run:
                return self._missing("run_code")
            code = (f"ax = {name}[{numeric[-1]!r}].plot(title={(name + ': ' + numeric[-1])!r})\n"
                    f"ax.set_xlabel('row')\nax.figure")
            return (f"Plotting the numeric column `{numeric[-1]}` of `{name}`. Running code in your kernel is a "
                    "write: the card shows the exact code.", [(run, {"code": code})])
        if failed:
            return (f"The plot did not run: {body[:300]}\n\n{DEMO_NOTICE}", [])
        return ("The plot ran in your kernel (its figure is in the tool result; a real model would describe "
                f"it).\n\n{DEMO_NOTICE}", [])

    def _run(self, step, results, tools):
        run = _find(tools, "run_code")
        if step == 0:
            if not run:
                return self._missing("run_code")
            return ("I'll run a short summary of your DataFrames in the kernel. That is a write: the card shows "
                    "the exact code, and nothing runs until you approve it.", [(run, {"code": _SUMMARY_CELL})])
        failed, body = self._outcome(results)
        if failed:
            return (f"The code did not run: {body[:300]}\n\n{DEMO_NOTICE}", [])
        lines = "\n".join(f"    {line[:100]}" for line in body.strip().splitlines()[:20])
        return (f"The kernel printed:\n\n{lines}\n\n{DEMO_NOTICE}", [])

    @staticmethod
    def _missing(name: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        return ((f"I would use the `{name}` tool here, but this notebook's grant does not include it. "
                f"Grant it on the connect card or with `relay.connect([...])`.\n\n{DEMO_NOTICE}"), [])

    @staticmethod
    def _outcome(results: list[dict[str, Any]]) -> tuple[bool, str]:
        if not results:
            return False, ""
        first = results[0]
        body = first.get("content", "")
        if not isinstance(body, str):
            body = json.dumps(body)
        # the runtime labels tool results as untrusted data; the demo quotes only what is inside
        body = re.sub(r"^\s*<untrusted-data[^>]*>\n?|\n?</untrusted-data>\s*$", "", body)
        return bool(first.get("is_error")), body

    def _dataframes(self, step, results, tools):
        list_vars = _find(tools, "list_variables")
        describe = _find(tools, "describe_dataframe")
        if step == 0:
            return ("Let me look at the variables in your kernel.", [(list_vars, {})]) if list_vars \
                else self._missing("list_variables")
        failed, body = self._outcome(results)
        if step == 1:
            name = None if failed else self._frame_name(body)
            if name is None:
                return (f"I could not find a DataFrame in the kernel.\n\n{DEMO_NOTICE}", [])
            if not describe:
                return self._missing("describe_dataframe")
            return (f"`{name}` is a DataFrame; describing it.", [(describe, {"name": name})])
        if failed:
            return (f"Describing the DataFrame failed: {body[:200]}\n\n{DEMO_NOTICE}", [])
        # shape, dtypes and the head in full (it used to stop after six lines, at "head:")
        first = body.strip().splitlines()[:30]
        summary = "\n".join(f"    {line[:120]}" for line in first)
        return (("Here is what the kernel reported (a real model would interpret it):\n\n"
                f"{summary}\n\n{DEMO_NOTICE}"), [])

    def _scratch(self, step, results, tools):
        write, edit, push = _find(tools, "scratch_write"), _find(tools, "scratch_edit"), _find(tools, "scratch_push")
        if step == 0:
            if not write:
                return self._missing("scratch_write")
            return ("I'll draft a cleaning script in the scratch workspace first; nothing outside it changes yet.",
                    [(write, {"path": "clean.py", "content": _DEMO_SCRIPT})])
        failed, body = self._outcome(results)
        if failed:
            return (f"That step was refused or failed: {body[:300]}\n\n{DEMO_NOTICE}", [])
        if step == 1:
            if not edit:
                return self._missing("scratch_edit")
            return ("Now an exact edit: keep rows that have any value, and strip column names once.",
                    [(edit, {"path": "clean.py", "edits": [
                        {"old_text": 'df = df.dropna(how="all")',
                         "new_text": 'df = df.dropna(how="all").copy()'}]})])
        if step == 2:
            if not push:
                return self._missing("scratch_push")
            return (("The edit came back as a unified diff. Now I ask to write the file into your project as "
                    "`clean.py`: that is a write, so you decide (the card shows the diff against the target)."),
                    [(push, {"path": "clean.py", "target": "clean.py"})])
        return ("Written. `relay.checkpoints()` lists the push and `relay.revert(id)` undoes it.\n\n"
                + DEMO_NOTICE, [])

    def _time(self, step, results, tools):
        clock = _find(tools, "get_current_time")
        if step == 0:
            if not clock:
                return self._missing("time__get_current_time")
            return ("Asking the time MCP server.", [(clock, {"timezone": "UTC"})])
        failed, body = self._outcome(results)
        verdict = "failed" if failed else "answered"
        return (f"The time server {verdict}:\n\n    {body[:300]}\n\n{DEMO_NOTICE}", [])

    def _cell(self, step, results, tools):
        propose = _find(tools, "propose_cell")
        if step == 0:
            if not propose:
                return self._missing("propose_cell")
            return ("I'll propose a cell for you to review; it will not run until you run it.",
                    [(propose, {"code": _SUMMARY_CELL})])
        failed, body = self._outcome(results)
        if failed:
            return (f"The proposal was not accepted: {body[:200]}\n\n{DEMO_NOTICE}", [])
        return ("The cell is below this one. Run it when you are ready.\n\n" + DEMO_NOTICE, [])


def results_name(body: str) -> str | None:
    """The DataFrame's name in a ``describe_dataframe`` result (``name: DataFrame shape=...`` or ``name``)."""
    match = re.search(r"^\s*(?:DataFrame\s+)?`?([A-Za-z_]\w*)`?\s*[:(]", body, re.M)
    return match.group(1) if match else None


def _numeric_columns(body: str) -> list[str]:
    """Column names with a numeric dtype in a ``describe_dataframe`` result's dtypes section."""
    return [m.group(1) for m in re.finditer(r"^\s*([A-Za-z_][\w ]*?)\s+(?:int|float|uint)\d*\s*$", body, re.M)]
