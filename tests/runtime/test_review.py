"""Review mode: a reviewer model's strict JSON verdict; every failure denies and is recorded."""

from __future__ import annotations

import time

import pytest

from relay_jupyter.core.types import ConsentDecision, ConsentRequest, PermissionMode, ToolRequest, ToolSpec
from relay_jupyter.protocol.names import EventType
from relay_jupyter.runtime.review import ReviewConsent, parse_verdict
from relay_jupyter.testing import FakeAnthropic, Reply, tool_use

from .rig import KEY, make_backend, make_rig, tool_results


def request(deadline: float = 0) -> ConsentRequest:
    spec = ToolSpec(name="write_file", input_schema={"type": "object"})
    req = ToolRequest(origin="o", tool=spec, arguments={"path": "a", "api_key": "sk-ant-secretsecret"}, call_id="c")
    return ConsentRequest(request_id="r", request=req, deadline=deadline or time.time() + 30)


@pytest.mark.parametrize("text", [
    '{"verdict": "allow"}', '{"verdict": "yes", "reason": "x"}', 'Sure! {"verdict": "allow", "reason": "x"}',
    '{"verdict": "allow", "reason": "x", "extra": 1}', '["allow"]', '', '{"verdict": "allow", "reason": 3}',
])
def test_malformed_verdicts_raise(text):
    with pytest.raises(ValueError):
        parse_verdict(text)


def test_strict_verdicts_parse():
    assert parse_verdict(' {"verdict": "allow", "reason": "fine"}\n') == (ConsentDecision.ALLOW, "fine")
    assert parse_verdict('{"reason": "no", "verdict": "deny"}')[0] is ConsentDecision.DENY


@pytest.mark.asyncio
@pytest.mark.parametrize("answer,expected", [
    ('{"verdict": "allow", "reason": "harmless"}', ConsentDecision.ALLOW),
    ('{"verdict": "deny", "reason": "destructive"}', ConsentDecision.DENY),
    ("I think it is fine", ConsentDecision.DENY),
])
async def test_reviewer_over_the_fake_api(answer, expected):
    records = []
    with FakeAnthropic(api_key=KEY) as fake:
        fake.enqueue(Reply(answer))
        backend = make_backend("anthropic", fake)
        review = ReviewConsent(backend, "claude-review", record=lambda r, v: records.append(v))
        result = await review.ask(request())
        body = fake.requests[0].body
    assert result.decision is expected and result.answered_by == "mode:review"
    assert records[0]["verdict"] == expected.value
    assert records[0]["failed"] is (expected is ConsentDecision.DENY and "fine" in answer)
    assert body["tools"] == [] if "tools" in body else True
    assert "sk-ant-secretsecret" not in str(body)  # arguments are redacted for the reviewer
    assert "<untrusted-data" in str(body["messages"])


@pytest.mark.asyncio
async def test_missing_credentials_timeout_and_transport_errors_deny():
    assert (await ReviewConsent(None, "m").ask(request())).decision is ConsentDecision.DENY
    with FakeAnthropic(api_key=KEY) as fake:
        fake.enqueue(Reply('{"verdict": "allow", "reason": "x"}', first_token_delay=2.0))
        slow = await ReviewConsent(make_backend("anthropic", fake), "m", timeout=0.2).ask(request())
        assert slow.decision is ConsentDecision.DENY and "timed out" in slow.reason
        for _ in range(3):
            fake.enqueue_error(500)
        broken = await ReviewConsent(make_backend("anthropic", fake), "m").ask(request())
        assert broken.decision is ConsentDecision.DENY and "BACKEND_ERROR" in broken.reason

    def no_key():
        from relay_jupyter.backends.keys import KeySource
        KeySource(env={}).require("anthropic")

    missing = await ReviewConsent(no_key, "m").ask(request())
    assert missing.decision is ConsentDecision.DENY and "NO_CREDENTIALS" in missing.reason


@pytest.mark.asyncio
async def test_review_mode_run_records_verdict_and_gate_uses_it():
    with FakeAnthropic(api_key=KEY) as fake:
        rig = make_rig("anthropic", fake)
        fake.enqueue(Reply(tool_use("write_file", {"path": "a", "content": "b"})),
                     Reply('{"verdict": "deny", "reason": "not asked for"}'), Reply("ok"))
        run_id, terminal = await rig.run(mode=PermissionMode.REVIEW)
        assert terminal == EventType.DONE
        assert rig.tools.written == []
        verdict = rig.events.of(EventType.REVIEW, run_id)[0]
        assert verdict["verdict"] == "deny" and verdict["reason"] == "not asked for"
        assert "CONSENT_DENIED" in tool_results(fake.requests[2].body)[0][1]
        denied = [r for r in rig.audit.records if r.tool == "write_file" and r.decision == "deny"]
        assert denied[0].answered_by == "mode:review"


@pytest.mark.asyncio
async def test_reviewer_requests_are_charged_to_the_origin_budget():
    """A reviewer request costs tokens: it is reserved and settled against the origin's rate and day
    budgets (audited as a model request with purpose review), and a budget refusal denies the write."""
    from relay_jupyter.core.types import Budget

    with FakeAnthropic(api_key=KEY) as fake:
        rig = make_rig("anthropic", fake)
        fake.enqueue(Reply(tool_use("write_file", {"path": "a", "content": "b"})),
                     Reply('{"verdict": "allow", "reason": "fine"}'), Reply("ok"))
        run_id, terminal = await rig.run(mode=PermissionMode.REVIEW)
        assert terminal == EventType.DONE and rig.tools.written == [{"path": "a", "content": "b"}]
        models = [r for r in rig.audit.records if r.tool.startswith("model:")]
        assert [(r.decision, r.arguments.get("purpose")) for r in models if r.decision != "settled"] == \
            [("allow", None), ("allow", "review"), ("allow", None)]
        settled = [r.arguments["tokens"] for r in models if r.decision == "settled"]
        assert len(settled) == 3 and all(t > 0 for t in settled)  # two agent steps and the review
        assert rig.manager.gate.ledger.usage(rig.ctx().origin)["tokens"] == sum(settled)

    with FakeAnthropic(api_key=KEY) as fake:
        # 2 requests a minute: the agent's first step and the write call's gate check; none left for review
        rig = make_rig("anthropic", fake, budget=Budget(requests_per_minute=2, tokens_per_day=None,
                                                        cost_per_day_usd=None))
        fake.enqueue(Reply(tool_use("write_file", {"path": "a", "content": "b"})), Reply("ok"))
        run_id, terminal = await rig.run(mode=PermissionMode.REVIEW)
        assert rig.tools.written == []
        verdict = rig.events.of(EventType.REVIEW, run_id)[0]
        assert verdict["verdict"] == "deny" and verdict["failed"] and "BUDGET_EXCEEDED" in verdict["reason"]
        assert len(fake.requests) == 1  # the reviewer request was never sent
        assert terminal == EventType.BUDGET_EXHAUSTED  # and the next agent step is out of rate too
