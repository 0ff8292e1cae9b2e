"""The OpenAI-compatible endpoint inside a real Jupyter server (issue 16 item 8): a real kernel's own
credential is the ``openai`` SDK's API key (``Authorization: Bearer``), from the test process and from inside
the kernel; the origin is the kernel's notebook, stamped by the broker.

Proves: a missing or wrong credential, and the Jupyter token, get OpenAI's 401 shape (the SDK's
``AuthenticationError``), never Jupyter's login page, and nothing reaches the upstream; with the notebook's
grant the SDK's answers (streamed and not) come from the upstream with the broker's key, the key never
reaches the kernel, and every request is audited and charged to the notebook's ledger.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

# the kernel rig (a real Jupyter server and its kernels) lives in tests/kernel
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel.conftest import execute, text_of  # noqa: E402
from kernel.real_server import RealServer  # noqa: E402

from relay_jupyter.testing import FakeOpenAI  # noqa: E402
from relay_jupyter.testing.script import Reply, Usage, text  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "sk-openai-broker-key-fedcba9876543210"
MODEL = "gpt-fake-1"



@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("openai-proxy")
    with FakeOpenAI(api_key=KEY, models=(MODEL, "gpt-other-2")) as fake, \
            RealServer(tmp, relay_config={"openai_base_url": fake.base_url, "openai_api_key": KEY,
                                          "default_backend": "openai", "default_model": MODEL}) as srv:
        kc = srv.kernel_for("oai.ipynb")
        _, msgs = execute(kc, "import os; print(os.environ['RELAY_KERNEL_CREDENTIAL']); print(os.environ['RELAY_URL'])")
        credential, relay_url = text_of(msgs).split()[:2]
        yield srv, fake, kc, credential, relay_url


def test_credentials_other_than_the_kernels_get_openais_401(served) -> None:
    srv, fake, _, credential, relay_url = served
    before = len(fake.requests)
    for key in ("not-a-credential", KEY):  # the broker's own key is not a credential either
        client = openai.OpenAI(api_key=key, base_url=relay_url + "openai/v1", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 401 and err.value.body["type"] == "authentication_error"
    # the Jupyter token does not open this endpoint (an SDK in a browser tab is not a kernel)
    req = urllib.request.Request(relay_url + "openai/v1/chat/completions", data=b"{}", method="POST",
                                 headers={"Authorization": "token relay-test-token"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=30)
    assert http.value.code == 401 and set(json.loads(http.value.read())["error"]) == {"message", "type", "param", "code"}
    assert len(fake.requests) == before


def test_the_kernels_credential_reaches_the_upstream_through_the_gate(served) -> None:
    srv, fake, kc, credential, relay_url = served
    client = openai.OpenAI(api_key=credential, base_url=relay_url + "openai/v1", max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as denied:  # the notebook has no grant yet
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert denied.value.body["code"] == "UNAUTHORIZED" and "notebook:oai.ipynb" in denied.value.body["message"]

    assert "result" in srv.kernel_rpc(credential, "grants.create", {"tools": [], "models": [MODEL]})
    fake.enqueue(Reply(text("Hello from upstream."), usage=Usage(input_tokens=9, output_tokens=4)),
                 Reply(text("streamed to the test")))
    answer = client.chat.completions.create(model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "Hello from upstream."
    stream = client.chat.completions.create(model=MODEL, max_tokens=32, stream=True,
                                            messages=[{"role": "user", "content": "go"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "streamed to the test"

    fake.enqueue(Reply(text("from a cell")))
    _, msgs = execute(kc, "import openai, os\n"
                          "c = openai.OpenAI(api_key=os.environ['RELAY_KERNEL_CREDENTIAL'],"
                          " base_url=os.environ['RELAY_URL'] + 'openai/v1', max_retries=0)\n"
                          f"print(c.chat.completions.create(model={MODEL!r}, max_tokens=16,"
                          " messages=[{'role': 'user', 'content': 'x'}]).choices[0].message.content)", timeout=60)
    out = text_of(msgs)
    assert "from a cell" in out and KEY not in out, out

    audit = srv.kernel_rpc(credential, "audit.tail", {"n": 50})["result"]["records"]
    proxied = [r for r in audit if r["tool"] == f"model:{MODEL}" and r["origin"] == "notebook:oai.ipynb"]
    assert [r["decision"] for r in proxied].count("allow") == 3
    assert [r["decision"] for r in proxied].count("settled") == 3
    assert all(r["arguments"].get("purpose") == "proxy" for r in proxied if r["decision"] == "allow")
    budget = srv.kernel_rpc(credential, "budget.get")["result"]
    assert budget["usage"]["tokens"] >= 9 + 4 and budget["usage"]["reserved_tokens"] == 0


def test_relay_openai_helpers_in_a_cell(served) -> None:
    """``relay.openai()`` / ``relay.async_openai()`` (issue 16): the official SDK wired to ``relay/openai/v1`` with
    the kernel's credential (imported only when called), through the gate like any request of the notebook."""
    srv, fake, kc, credential, relay_url = served
    srv.kernel_rpc(credential, "grants.create", {"tools": [], "models": [MODEL]})
    before = len(fake.requests)
    fake.enqueue(Reply(text("sync openai helper")), Reply(text("async openai helper")))
    _, msgs = execute(kc, "%load_ext relay_jupyter\nimport os\n"
                          "c = relay.openai(max_retries=0)\n"
                          "print(str(c.base_url), c.api_key == os.environ['RELAY_KERNEL_CREDENTIAL'])\n"
                          f"print(c.chat.completions.create(model={MODEL!r}, max_tokens=16,"
                          " messages=[{'role': 'user', 'content': 'x'}]).choices[0].message.content)\n"
                          "a = relay.async_openai(max_retries=0)\n"
                          f"r = await a.chat.completions.create(model={MODEL!r}, max_tokens=16,"
                          " messages=[{'role': 'user', 'content': 'y'}])\n"
                          "print(r.choices[0].message.content)\n"
                          "try:\n"
                          f"    relay.openai(max_retries=0).chat.completions.create(model='gpt-other-2', max_tokens=8,"
                          " messages=[{'role': 'user', 'content': 'z'}])\n"
                          "except Exception as e:\n"
                          "    print(type(e).__name__, e.body['code'])\n", timeout=90)
    out = text_of(msgs)
    assert f"{relay_url}openai/v1/ True" in out, out
    assert "sync openai helper" in out and "async openai helper" in out, out
    assert "PermissionDeniedError SCOPE_EXCEEDED" in out, out  # a model outside the grant: refused by the gate
    assert len(fake.requests) == before + 2  # the refused request never reached the upstream
    assert KEY not in out
    assert fake.saw_api_key(KEY) and not fake.saw_api_key(credential)  # the broker's key upstream, never the kernel's
