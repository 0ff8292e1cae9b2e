"""The built-in engine's per-run tool estimates (issue 18): each offered tool's share of the request estimate
is computed once per run, and the total is exactly what ``estimate_request`` gives."""

from __future__ import annotations

from relay_jupyter.core.budgets import estimate_request
from relay_jupyter.core.types import ToolSpec
from relay_jupyter.runtime.relay_loop import ToolEstimates


def test_cached_tool_shares_give_the_exact_estimate():
    specs = [ToolSpec(name=f"t{i}", description="does things " * i, input_schema={
        "type": "object", "properties": {f"p{j}": {"type": "string", "description": "x" * j} for j in range(i)}})
        for i in range(30)]
    messages = [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    est = ToolEstimates()
    for _ in range(3):  # three steps of one run
        assert est.request("system prompt", messages, specs, 512) == estimate_request("system prompt", messages,
                                                                                      specs, 512)
    assert len(est._tokens) == len(specs)  # computed once each
    assert est.request("s", messages, [], 8) == estimate_request("s", messages, [], 8)  # no tools: no tool prompt
    changed = specs[0].model_copy(update={"description": "now much longer " * 50})
    assert est.request("s", messages, [changed], 8) == estimate_request("s", messages, [changed], 8)
