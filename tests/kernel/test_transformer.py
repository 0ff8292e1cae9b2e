"""The input transformer: %%agent cells become one top-level await; the prompt stays a string."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from relay_jupyter.kernel.consent import ConsentPolicy, ask
from relay_jupyter.kernel.transformer import agent_transformer, rewrite

from .conftest import execute, text_of
from .fake_broker import FakeBroker

NASTY = ['"); import os; os.system("touch pwned"); ("', "'''\n\"\"\"\\", "\x00\u202e", "%%agent\n%agent x"]


def _call_args(source: str) -> list[Any]:
    tree = ast.parse(source)
    assert len(tree.body) == 1
    node = tree.body[0].value
    assert isinstance(node, ast.Await) and isinstance(node.value, ast.Call)
    assert all(isinstance(a, ast.Constant) for a in node.value.args)
    return [a.value for a in node.value.args]


@pytest.mark.parametrize("body", NASTY)
def test_prompt_is_only_ever_a_string_literal(body: str) -> None:
    source = rewrite(f"%%agent --chat x\n{body}")
    assert source is not None
    assert _call_args(source) == ["--chat x", body]


def test_non_agent_cells_are_untouched() -> None:
    lines = ["x = '%%agent'\n", "print(x)\n"]
    assert agent_transformer(lines) == lines
    assert rewrite("  %%agentx\nhi") is None
    assert rewrite("def f():\n    %agent hi\n") is None


def test_line_magic_and_leading_blank_lines() -> None:
    assert _call_args(rewrite("\n\n%%agent\nhello") or "") == ["", "hello"]
    out = rewrite("x = 1\n%agent --new summarise x\n")
    assert out is not None and "run_cell_async('--new summarise x')" in out and out.startswith("x = 1\n")


def test_line_magic_runs_in_a_kernel(kernel: Any, broker: FakeBroker) -> None:
    broker.script([("text", "one-liner answer")])
    reply, msgs = execute(kernel, "%agent what is 2+2?")
    assert reply["status"] == "ok", text_of(msgs)
    assert "one-liner answer" in text_of(msgs)
    assert [p for m, p in broker.calls if m == "run.start"][-1]["prompt"] == "what is 2+2?"


@pytest.mark.asyncio
async def test_terminal_prompt_answers(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    data = {"request_id": "r", "tool": "run_code", "arguments": {"code": "print(1)"}, "deadline": 10**12}
    for typed, expected in (("y", ("allow", "once")), ("r", ("allow", "run")), ("a", ("allow", "notebook")),
                            ("", ("deny", "once")), ("nope", ("deny", "once"))):
        monkeypatch.setattr("builtins.input", lambda _prompt, typed=typed: typed)
        answer = await ask(data, "input", ConsentPolicy(timeout=5))
        assert (answer.decision, answer.scope) == expected
    assert "print(1)" in capsys.readouterr().out  # the card is printed with the exact code
