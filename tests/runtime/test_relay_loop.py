"""The built-in engine's per-run tool estimates (issue 18): each offered tool's share of the request estimate
is computed once per run, and the total is exactly what ``estimate_request`` gives."""

from __future__ import annotations

import asyncio

from relay_jupyter.core.budgets import estimate_request
from relay_jupyter.core.types import ToolSpec
from relay_jupyter.runtime.relay_loop import ToolEstimates


def test_cached_tool_shares_give_the_exact_estimate():
    specs = [ToolSpec(name=f"t{i}", description="does things " * i, input_schema={
        "type": "object", "properties": {f"p{j}": {"type": "string", "description": "x" * j} for j in range(i)}})
        for i in range(30)]
    messages = [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    est = ToolEstimates()

    def request(*args):
        return asyncio.run(est.request(*args))

    for _ in range(3):  # three steps of one run
        assert request("system prompt", messages, specs, 512) == estimate_request("system prompt",
                                                                                  messages, specs, 512)
    assert len(est._tokens) == len(specs)  # computed once each
    assert request("s", messages, [], 8) == estimate_request("s", messages, [], 8)  # no tools: no tool prompt
    changed = specs[0].model_copy(update={"description": "now much longer " * 50})
    assert request("s", messages, [changed], 8) == estimate_request("s", messages, [changed], 8)


def test_the_estimate_taken_message_by_message_while_sharing_the_loop_is_exact():
    """A long history is estimated in slices (the loop runs other tasks between them): the total is still
    exactly ``estimate_request``'s, for string and block contents, tool calls, results and non-ASCII text."""
    from relay_jupyter.runtime.driver import LoopShare

    messages = []
    for i in range(400):
        messages.append({"role": "user", "content": "question ✓ 42; " * (i % 37)})
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": "answer " * i},
            {"type": "tool_use", "id": f"c{i}", "name": "scratch_read",
             "input": {"path": f"data/{i}.csv", "n": i}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"c{i}", "content": "1,2,3\n" * i, "is_error": False}]})
    spec = ToolSpec(name="scratch_read", description="reads", input_schema={"type": "object"})

    async def sliced():
        loop = asyncio.get_running_loop()
        others = 0

        async def other():  # a task that only runs when the estimate lets the loop go
            nonlocal others
            while True:
                others += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        before = others
        got = await ToolEstimates().request("system", messages, [spec], 4096, LoopShare(loop, after=0.0))
        ran = others - before
        task.cancel()
        return got, ran

    got, ran = asyncio.run(sliced())
    assert got == estimate_request("system", messages, [spec], 4096)
    assert ran > 100  # with a zero slice it yielded between messages
