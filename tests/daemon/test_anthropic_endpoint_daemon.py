"""The Anthropic-compatible endpoint on the standalone daemon (issue 16 item 1): the same paths as inside
Jupyter; the official SDK authenticates with the daemon token as its API key (``x-api-key``) or as
``auth_token`` (Bearer); a missing or wrong token is the SDK's ``AuthenticationError`` (an Anthropic-shaped
401, the same bytes for both); the origin is ``daemon:<X-Relay-Client>``; the upstream sees the broker's key."""

from __future__ import annotations

import json

import anthropic
import pytest
from daemon_harness import run_cli, start_daemon

from relay_jupyter.testing import FakeAnthropic
from relay_jupyter.testing.script import Reply, text

pytestmark = pytest.mark.slow

KEY = "sk-ant-daemon-upstream-key-0123456789"
MODEL = "claude-test-1"


def test_sdk_through_the_daemon_with_its_token(tmp_path):
    with FakeAnthropic(api_key=KEY, models=(MODEL,)) as fake:
        config = tmp_path / "broker.json"
        config.write_text(json.dumps({"anthropic_api_key": KEY, "anthropic_base_url": fake.base_url,
                                      "default_model": MODEL}))
        done = run_cli(tmp_path, "grants", "add", "daemon:sdk", "--tools", "*", "--models", MODEL)
        assert done.returncode == 0, done.stderr
        daemon = start_daemon(tmp_path, "--listen", "tcp://127.0.0.1:0", "--config", str(config))
        try:
            base = f"http://127.0.0.1:{daemon.port}/relay/anthropic"
            token = daemon.token()
            headers = {"X-Relay-Client": "sdk"}
            fake.enqueue(Reply(text("via the daemon")), Reply(text("bearer too")))
            for client in (anthropic.Anthropic(api_key=token, base_url=base, default_headers=headers, max_retries=0),
                           anthropic.Anthropic(auth_token=token, base_url=base, default_headers=headers,
                                               max_retries=0)):
                msg = client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "x"}])
                assert msg.content[0].text in ("via the daemon", "bearer too")
            assert token not in json.dumps([r.headers for r in fake.requests])

            bodies = []
            for bad in ("wrong-token", ""):
                client = anthropic.Anthropic(api_key=bad or "x", base_url=base, default_headers=headers, max_retries=0)
                if not bad:
                    client = client.with_options(default_headers={**headers, "x-api-key": ""})
                with pytest.raises(anthropic.AuthenticationError) as err:
                    client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "x"}])
                bodies.append(err.value.body)
            assert bodies[0] == bodies[1] and bodies[0]["error"]["type"] == "authentication_error"

            # another client name is another origin: no grant
            other = anthropic.Anthropic(api_key=token, base_url=base, default_headers={"X-Relay-Client": "other"},
                                        max_retries=0)
            with pytest.raises(anthropic.PermissionDeniedError) as denied:
                other.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "x"}])
            assert "[UNAUTHORIZED]" in str(denied.value) and "daemon:other" in str(denied.value)
        finally:
            daemon.stop()
