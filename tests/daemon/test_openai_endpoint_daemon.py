"""The OpenAI-compatible endpoint on the standalone daemon (issue 16 item 8): the same path as inside Jupyter;
the official ``openai`` SDK authenticates with the daemon token as its API key (``Authorization: Bearer``);
a missing or wrong token is the SDK's ``AuthenticationError`` with OpenAI's shape (the same bytes for both);
the origin is ``daemon:<X-Relay-Client>``; the upstream gets the broker's key (the fake refuses any other),
never the token."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest
from daemon_harness import run_cli, start_daemon

from relay_jupyter.testing import FakeOpenAI
from relay_jupyter.testing.script import Reply, text

pytestmark = pytest.mark.slow

KEY = "sk-openai-daemon-upstream-key-0123456789"
MODEL = "gpt-fake-1"


def test_openai_sdk_through_the_daemon_with_its_token(tmp_path):
    with FakeOpenAI(api_key=KEY, models=(MODEL,)) as fake:
        config = tmp_path / "broker.json"
        config.write_text(json.dumps({"openai_base_url": fake.base_url, "openai_api_key": KEY,
                                      "default_backend": "openai", "default_model": MODEL}))
        done = run_cli(tmp_path, "grants", "add", "daemon:sdk", "--tools", "*", "--models", MODEL)
        assert done.returncode == 0, done.stderr
        daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0", "--config", str(config))
        try:
            base = f"http://127.0.0.1:{daemon.port}/relay/openai/v1"
            token = daemon.token()
            headers = {"X-Relay-Client": "sdk"}
            client = openai.OpenAI(api_key=token, base_url=base, default_headers=headers, max_retries=0)
            fake.enqueue(Reply(text("via the daemon")), Reply(text("streamed via the daemon")))
            answer = client.chat.completions.create(model=MODEL, max_tokens=16,
                                                    messages=[{"role": "user", "content": "x"}])
            assert answer.choices[0].message.content == "via the daemon"
            stream = client.chat.completions.create(model=MODEL, max_tokens=16, stream=True,
                                                    messages=[{"role": "user", "content": "x"}])
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "streamed via the daemon"
            assert [m.id for m in client.models.list()] == [MODEL]
            assert token not in json.dumps([r.headers for r in fake.requests])

            # another client name is another origin: no grant
            before = len(fake.requests)
            other = openai.OpenAI(api_key=token, base_url=base, default_headers={"X-Relay-Client": "other"},
                                  max_retries=0)
            with pytest.raises(openai.PermissionDeniedError) as denied:
                other.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
            assert denied.value.body["code"] == "UNAUTHORIZED" and "daemon:other" in denied.value.body["message"]

            # a wrong token (the SDK) and none (a bare request): the same OpenAI-shaped 401 bytes
            with pytest.raises(openai.AuthenticationError) as wrong:
                openai.OpenAI(api_key="wrong-token", base_url=base, default_headers=headers, max_retries=0
                              ).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
            missing = httpx2.post(base + "/chat/completions", headers=headers, json={"model": MODEL})
            assert missing.status_code == wrong.value.status_code == 401
            assert missing.content == wrong.value.response.content
            assert missing.json()["error"]["type"] == "authentication_error"
            assert len(fake.requests) == before
        finally:
            daemon.stop()


def test_relay_openai_reaches_the_daemon_over_its_unix_socket(tmp_path):
    """``relay.openai()`` in a kernel attached to a daemon on a Unix socket (issue 16): the client gets an ``httpx``
    transport bound to the socket, the daemon knows the caller by the socket (its peer), and the request goes
    through the gate of that client's origin to the upstream with the broker's key."""
    from types import SimpleNamespace

    from relay_jupyter.kernel.sdk_clients import openai_client

    with FakeOpenAI(api_key=KEY, models=(MODEL,)) as fake:
        config = tmp_path / "broker.json"
        config.write_text(json.dumps({"openai_base_url": fake.base_url, "openai_api_key": KEY,
                                      "default_backend": "openai", "default_model": MODEL}))
        assert run_cli(tmp_path, "grants", "add", "daemon:sock", "--tools", "*", "--models", MODEL).returncode == 0
        (tmp_path / "sock").mkdir(mode=0o700)
        daemon = start_daemon(tmp_path, "--listen", f"unix://{tmp_path}/sock/relay.sock", "--config", str(config))
        try:
            endpoint = SimpleNamespace(url=daemon.address, auth="", client_name="sock")
            fake.enqueue(Reply(text("over the socket")), Reply(text("async over the socket")))
            client = openai_client(endpoint, max_retries=0)
            answer = client.chat.completions.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "x"}])
            assert answer.choices[0].message.content == "over the socket"

            async def go() -> str:
                aclient = openai_client(endpoint, asynchronous=True, max_retries=0)
                r = await aclient.chat.completions.create(model=MODEL, max_tokens=16,
                                                          messages=[{"role": "user", "content": "y"}])
                await aclient.close()
                return r.choices[0].message.content

            import asyncio

            assert asyncio.run(go()) == "async over the socket"
            # another client name on the same socket is another origin: no grant, nothing forwarded
            before = len(fake.requests)
            with pytest.raises(openai.PermissionDeniedError) as denied:
                openai_client(SimpleNamespace(url=daemon.address, auth="", client_name="other"), max_retries=0
                              ).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "z"}])
            assert denied.value.body["code"] == "UNAUTHORIZED" and "daemon:other" in denied.value.body["message"]
            assert len(fake.requests) == before == 2 and fake.saw_api_key(KEY)
        finally:
            daemon.stop()
