"""Attack: use the Jupyter server's own login — its token or a browser's cookie — where only a kernel's
credential or a gateway token may open the door.

A real Jupyter server (subprocess) with the relay extension, the fake Anthropic and OpenAI servers as upstreams.
The attacker holds the Jupyter token (kernel code can read it from ``jpserver-<pid>.json``, docs/security.md) and a
logged-in browser cookie with its ``_xsrf``, and presents them every way a client library might: ``Authorization:
token``, ``Authorization: Bearer``, ``x-api-key``, ``?token=`` in the URL, the cookie with and without the XSRF
header, to both model endpoints (messages, chat completions, model lists) and the MCP gateway. Held: each is
refused (401 in the endpoint's own shape; the gateway 400 for a token in the URL) and nothing reaches an upstream.
The check can fail: the kernel's credential does open the Anthropic endpoint and the upstream sees that request.
"""

from __future__ import annotations

import http.cookiejar
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from real_server import TOKEN, RealServer

from relay_jupyter.testing import FakeAnthropic, FakeOpenAI, Reply, text

pytestmark = pytest.mark.slow

KEY_A = "sk-ant-attack-jupyter-token-0123456789"
KEY_O = "sk-openai-attack-jupyter-token-0123456789"
MODEL_A, MODEL_O = "claude-test-1", "gpt-test-1"


def _post(url: str, body: dict, headers: dict[str, str], opener=None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with (opener.open(req, timeout=30) if opener else urllib.request.urlopen(req, timeout=30)) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _get(url: str, headers: dict[str, str], opener=None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method="GET", headers=headers)
    try:
        with (opener.open(req, timeout=30) if opener else urllib.request.urlopen(req, timeout=30)) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_jupyter_login_opens_no_model_endpoint_and_no_gateway(tmp_path: Path) -> None:
    with FakeAnthropic(api_key=KEY_A, models=(MODEL_A,)) as fake_a, \
            FakeOpenAI(api_key=KEY_O, models=(MODEL_O,)) as fake_o, \
            RealServer(tmp_path, relay_config={"anthropic_api_key": KEY_A, "anthropic_base_url": fake_a.base_url,
                                               "openai_api_key": KEY_O, "openai_base_url": fake_o.base_url,
                                               "default_model": MODEL_A}) as srv:
        # the browser's login: a cookie and its _xsrf, as JupyterLab holds them
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        browser.open(srv.url + f"lab?token={TOKEN}", timeout=30).read()
        browser.open(srv.url + "api/status", timeout=30).read()
        xsrf = next((c.value for c in jar if c.name == "_xsrf"), "")
        assert any(c.name.startswith("username-") for c in jar), [c.name for c in jar]  # logged in

        anthropic_body = {"model": MODEL_A, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        openai_body = {"model": MODEL_O, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        mcp_body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        posts = [("relay/anthropic/v1/messages", anthropic_body), ("relay/anthropic/v1/messages/count_tokens",
                                                                   anthropic_body),
                 ("relay/openai/v1/chat/completions", openai_body), ("relay/mcp", mcp_body)]
        gets = ["relay/anthropic/v1/models", "relay/openai/v1/models"]
        forms = [{"Authorization": f"token {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}"}, {"x-api-key": TOKEN},
                 {"api-key": TOKEN}]
        seen: list[tuple[str, str, int]] = []
        for path, body in posts:
            for headers in forms:
                seen.append((path, json.dumps(headers), _post(srv.url + path, body, headers)[0]))
            seen.append((path, "?token=", _post(srv.url + path + f"?token={TOKEN}", body, {})[0]))
            seen.append((path, "cookie", _post(srv.url + path, body, {}, browser)[0]))
            seen.append((path, "cookie+xsrf", _post(srv.url + path, body, {"X-XSRFToken": xsrf}, browser)[0]))
        for path in gets:
            for headers in forms:
                seen.append((path, json.dumps(headers), _get(srv.url + path, headers)[0]))
            seen.append((path, "?token=", _get(srv.url + path + f"?token={TOKEN}", {})[0]))
            seen.append((path, "cookie", _get(srv.url + path, {}, browser)[0]))
        opened = [s for s in seen if s[2] < 400 or s[2] >= 500]
        assert not opened, opened
        for path, how, status in seen:  # 401 everywhere; the gateway says 400 to a token in the URL
            assert status == (400 if path == "relay/mcp" and how == "?token=" else 401), (path, how, status)
        assert [r for r in fake_a.requests if r.path != "/v1/models"] == [] and fake_o.requests == []

        # the check can fail: the kernel's own credential opens the Anthropic endpoint
        kc = srv.kernel_for("a.ipynb")
        out: list[str] = []
        kc.execute_interactive("import os; print(os.environ['RELAY_KERNEL_CREDENTIAL'])", timeout=60,
                               output_hook=lambda m: out.append(m["content"].get("text", ""))
                               if m["msg_type"] == "stream" else None)
        credential = "".join(out).strip()
        assert "result" in srv.kernel_rpc(credential, "grants.create", {"tools": [], "models": [MODEL_A]})
        fake_a.enqueue(Reply(text("through the gate")))
        status, answer = _post(srv.url + "relay/anthropic/v1/messages", anthropic_body, {"x-api-key": credential})
        assert status == 200 and json.loads(answer)["content"][0]["text"] == "through the gate", answer
        assert len([r for r in fake_a.requests if r.path == "/v1/messages"]) == 1
