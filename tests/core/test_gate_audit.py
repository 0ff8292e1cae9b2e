"""Secrets in tool arguments never reach an audit record, whatever the gate decides."""

from __future__ import annotations

import asyncio

import pytest
from core_support import make_rig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_jupyter.core.consent import StaticConsent
from relay_jupyter.core.errors import GateRefusal
from relay_jupyter.core.types import Budget, Grant, PermissionMode, ToolClass, ToolRequest, ToolSpec

_alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_tail = st.text(alphabet=_alnum, min_size=20, max_size=60)
# (prefix shown to the world, credential that must never appear)
secrets = st.one_of(
    _tail.map(lambda t: ("sk-ant-api03-", t)),
    _tail.map(lambda t: ("sk-proj-", t)),
    _tail.map(lambda t: ("ghp_", t)),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", min_size=16, max_size=16).map(lambda t: ("AKIA", t)),
    _tail.map(lambda t: ("Authorization: Bearer ", t)),
    _tail.map(lambda t: ("password=", t)),
    _tail.map(lambda t: ("https://user:", t + "@example.com")),
    _tail.map(lambda t: ("-----BEGIN PRIVATE KEY-----\n", t + "\n-----END PRIVATE KEY-----")),
)
words = st.text(alphabet=" .,:;-_()abcXYZ\n", max_size=20)
secret_keys = st.sampled_from(["password", "api_key", "apiKey", "token", "Authorization", "client_secret"])


@st.composite
def arguments_with_secret(draw):
    prefix, cred = draw(secrets)
    how = draw(st.sampled_from(["text", "key", "list", "deep", "dictkey"]))
    text = draw(words) + prefix + cred + draw(words)
    if how == "text":
        args = {"note": text}
    elif how == "key":
        args = {draw(secret_keys): cred}
    elif how == "list":
        args = {"items": [draw(words), text, 3]}
    elif how == "deep":
        args = {"a": {"b": [{"c": text}]}}
    else:
        args = {"headers": {text: "v"}}
    return args, cred


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=arguments_with_secret(), tool_class=st.sampled_from(list(ToolClass)),
       outcome=st.sampled_from(["no-grant", "scope", "allow", "deny", "full", "error"]),
       max_str=st.integers(1, 300))
def test_property_secrets_never_in_audit(case, tool_class, outcome, max_str):
    args, cred = case
    rig = make_rig()
    tool = ToolSpec(name="t", tool_class=tool_class)
    if outcome != "no-grant":
        rig.book.issue(Grant(origin="o", tools=frozenset({"other"} if outcome == "scope" else {"t"}),
                             consent_id="c", budget=Budget(requests_per_minute=None)))
    mode = PermissionMode.FULL if outcome == "full" else PermissionMode.ASK
    consent = StaticConsent("deny" if outcome == "deny" else "allow")

    async def execute():
        if outcome == "error":
            raise RuntimeError("tool failed")
        return "ok"

    async def main():
        async with asyncio.timeout(5):
            await rig.gate.call_tool(ToolRequest(origin="o", tool=tool, call_id="k", arguments=args,
                                                 mode=mode), execute,
                                     consent)

    try:
        asyncio.run(main())
    except (GateRefusal, RuntimeError):
        pass
    assert rig.audit.records, "every decision is audited"
    dumped = "\n".join(r.model_dump_json() for r in rig.audit.records)
    assert cred not in dumped
    assert cred[:12] not in dumped  # not even a cut prefix of it


@pytest.mark.asyncio
async def test_completion_audit_has_no_prompt_content():
    """Model requests are audited by size only: nothing of the conversation is recorded."""
    rig = make_rig()
    rig.book.issue(Grant(origin="o", models=frozenset({"*"}), consent_id="c"))
    res = rig.gate.begin_completion("o", "claude-haiku-4-5", estimated_tokens=10)
    res.release()
    (rec,) = rig.audit.records
    assert set(rec.arguments) == {"estimated_tokens", "reserved_usd"}


@pytest.mark.asyncio
async def test_records_survive_the_json_lines_audit_log(tmp_path):
    """Records the gate builds (unvalidated, for speed) round-trip through the real AuditLog."""
    audit_log = pytest.importorskip("relay_jupyter.storage.audit_log")
    rig = make_rig()
    log = audit_log.AuditLog(tmp_path / "audit.jsonl")
    try:
        rig.gate.audit = log
        rig.book.issue(Grant(origin="o", tools=frozenset({"t"}), consent_id="c"))
        secret = "sk-ant-api03-" + "S" * 30

        async def execute():
            return 1

        await rig.gate.call_tool(ToolRequest(origin="o", tool=ToolSpec(name="t", tool_class=ToolClass.READ),
                                             call_id="k", arguments={"q": f"use {secret}"}), execute,
                                 StaticConsent("deny"))
        with pytest.raises(GateRefusal):
            await rig.gate.call_tool(ToolRequest(origin="o", tool=ToolSpec(name="t"), call_id="k2"), execute,
                                     StaticConsent("deny"))
        log.sync()
        records = log.tail(10)
        assert [(r.seq, r.decision, r.call_id) for r in records] == [(1, "allow", "k"), (2, "deny", "k2")]
        assert records[0].arguments == {"q": "use <masked>"}
        assert secret not in (tmp_path / "audit.jsonl").read_text()
    finally:
        log.close()
