"""One endpoint policy for every outbound URL: model base URLs follow the MCP endpoint policy.

https, or http to loopback; other http hosts only when listed in ``allow_insecure_endpoints``;
credentials in URLs and non-HTTP schemes refused at start with one line naming the setting; no URL
credential ever printed. Fast unit tables first, then the refusal at the start of a real Jupyter
server and of ``jupyter relay serve``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import redact, safe_url
from relay_jupyter.backends.openai import OpenAIBackend
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.runtime_setup import backends_from_config
from relay_jupyter.cli import main
from relay_jupyter.core.errors import Code, ConfigRefusal
from relay_jupyter.mcp.policy import check_endpoint, check_model_endpoint, parse_insecure_endpoints

SETTING = "c.RelayApp.openai_base_url"
PASSWORD = "hunter2-p@ss"

ALLOWED = [
    "https://api.anthropic.com",
    "https://llm.example.com:8443/v1",
    "HTTPS://API.EXAMPLE.COM/v1",
    "http://127.0.0.1:11434",
    "http://127.8.9.10:8000/v1",
    "http://localhost:1234/v1",
    "HTTP://LOCALHOST:1234/v1",
    "http://[::1]:8080/v1",
    "http://[::ffff:127.0.0.1]:8080/v1",
]

# (url, a fragment of the refusal): the URL tricks of an attacker or a typo
REFUSED = [
    ("http://evil.com/v1", "use https for evil.com"),
    ("http://127.0.0.1.evil.com/v1", "loopback"),
    ("http://localhost.evil.com/v1", "loopback"),
    ("http://localhost./v1", "loopback"),  # a trailing dot is a DNS name, resolved elsewhere
    ("http://0x7f000001/v1", "loopback"),  # inet_aton would say 127.0.0.1; we do not guess
    ("http://2130706433/v1", "loopback"),
    ("http://127.1/v1", "loopback"),
    ("http://0177.0.0.1/v1", "loopback"),
    ("http://0.0.0.0:8000/v1", "loopback"),
    ("http://[::]:8000/v1", "loopback"),
    ("http://10.0.0.5:8000/v1", "allow_insecure_endpoints"),
    ("http://[::ffff:10.0.0.1]/v1", "loopback"),
    ("http://%31%32%37.0.0.1/v1", "loopback"),
    ("http://evil.com#@127.0.0.1/v1", "loopback"),
    ("http://evil.com\\@127.0.0.1/v1", "credentials"),
    (f"https://user:{PASSWORD}@api.example.com/v1", "credentials"),
    (f"http://user:{PASSWORD}@127.0.0.1:8000/v1", "credentials"),
    ("https://sk-ant-api03-secretsecret@api.example.com", "credentials"),
    ("https://:hunter2@api.example.com", "credentials"),
    ("https://api.example.com/v1?api_key=hunter2", "query"),
    ("https://api.example.com/v1?x=1&access_token=hunter2", "query"),
    ("file:///etc/passwd", "scheme"),
    ("ws://127.0.0.1:8000/v1", "scheme"),
    ("wss://api.example.com/v1", "scheme"),
    ("ftp://127.0.0.1/v1", "scheme"),
    ("unix:///run/llm.sock", "scheme"),
    ("javascript:alert(1)", "scheme"),
    ("127.0.0.1:8000/v1", "scheme"),
    ("//api.example.com/v1", "scheme"),
    ("https://api.example.com/ v1", "whitespace"),
    ("https://api.example.com/\nv1", "control"),
    ("https://api.example.com:99999/v1", "not a valid URL"),
    ("https:///v1", "no host"),
    ("https://api.example.com/" + "a" * 3000, "longer"),
]


@pytest.mark.parametrize("url", ALLOWED)
def test_allowed_model_urls(url):
    assert check_model_endpoint(url, SETTING) == url
    assert BrokerConfig(openai_base_url=url).openai_base_url == url


@pytest.mark.parametrize(("url", "fragment"), REFUSED)
def test_refused_model_urls_name_the_setting_and_hide_credentials(url, fragment):
    for check in (lambda: check_model_endpoint(url, SETTING), lambda: BrokerConfig(openai_base_url=url),
                  lambda: BrokerConfig(anthropic_base_url=url)):
        with pytest.raises(ConfigRefusal) as info:
            check()
        message = info.value.message
        assert info.value.code is Code.ENDPOINT_REFUSED
        assert message.startswith("c.RelayApp.") and fragment in message, message
        assert "\n" not in message
        for secret in (PASSWORD, "hunter2", "secretsecret"):
            assert secret not in message


def test_insecure_allowlist_is_exact_host_and_port():
    allowed = parse_insecure_endpoints(["http://10.0.0.5:8000", "http://GPU-box.lan:11434/"])
    assert allowed == {("10.0.0.5", 8000), ("gpu-box.lan", 11434)}
    assert check_model_endpoint("http://10.0.0.5:8000/v1", SETTING, allow_insecure=allowed)
    assert check_model_endpoint("http://gpu-box.lan:11434", SETTING, allow_insecure=allowed)
    for url in ("http://10.0.0.5:8001/v1", "http://10.0.0.5/v1", "http://10.0.0.6:8000/v1",
                "http://user:pw@10.0.0.5:8000/v1", "ftp://10.0.0.5:8000/"):
        with pytest.raises(ConfigRefusal):
            check_model_endpoint(url, SETTING, allow_insecure=allowed)
    config = BrokerConfig(openai_base_url="http://10.0.0.5:8000/v1", allow_insecure_endpoints=("http://10.0.0.5:8000",))
    assert config.openai_base_url == "http://10.0.0.5:8000/v1"


@pytest.mark.parametrize("entry", ["10.0.0.5:8000", "https://10.0.0.5:8000", "http://10.0.0.5",
                                   "http://10.0.0.5:8000/v1", "http://u:p@10.0.0.5:8000", "http://h:1?x=1",
                                   "http://h:99999", "http:// h:1"])
def test_bad_allowlist_entries_are_refused(entry):
    with pytest.raises(ConfigRefusal) as info:
        BrokerConfig(allow_insecure_endpoints=(entry,))
    assert info.value.message.startswith("c.RelayApp.allow_insecure_endpoints:")
    assert "u:p" not in info.value.message


def test_mcp_policy_is_unchanged_by_the_allowlist():
    with pytest.raises(ConfigRefusal) as info:
        check_endpoint("http://10.0.0.5:8000/mcp")
    assert info.value.message.startswith("plain http is allowed only to loopback")
    assert check_endpoint("http://10.0.0.5:8000/mcp", allow_insecure={("10.0.0.5", 8000)})


def test_the_sdk_environment_url_follows_the_policy_too(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://proxy.example.com:8080")
    with pytest.raises(ConfigRefusal) as info:
        backends_from_config(BrokerConfig(anthropic_api_key="sk-test-1234567890"))
    assert info.value.message.startswith("$ANTHROPIC_BASE_URL")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    (backend,) = backends_from_config(BrokerConfig(anthropic_api_key="sk-test-1234567890")).values()
    assert "127.0.0.1:9" in repr(backend)


def test_reprs_never_show_url_credentials_or_keys():
    anthropic = AnthropicBackend("sk-ant-key-123456789", base_url=f"https://user:{PASSWORD}@api.example.com/x?k=v")
    openai = OpenAIBackend(f"http://user:{PASSWORD}@127.0.0.1:9/v1?api_key=hunter2", "sk-openai-987654321")
    for backend in (anthropic, openai):
        shown = repr(backend)
        assert PASSWORD not in shown and "user" not in shown and "hunter2" not in shown
        assert "sk-" not in shown
    assert safe_url(f"http://u:{PASSWORD}@[::1]:9/v1?t=1#f") == "http://[::1]:9/v1"


def test_redact_masks_keys_and_token_shapes():
    key = "sk-test-abcdefghij"
    text = f"bad key {key}; Authorization: Bearer abc.def.ghi; req 0123456789abcdef0123456789abcdef01\nline2"
    shown = redact(text, (key,))
    assert key not in shown and "abc.def.ghi" not in shown and "0123456789abcdef0123456789abcdef01" not in shown
    assert "\n" not in shown and shown.startswith("bad key [redacted]")
    assert len(redact("x" * 10_000)) <= 301


# ---- refused at start: jupyter relay serve, and a real Jupyter server --------------------------

@pytest.mark.parametrize(("url", "fragment"), REFUSED)
def test_relay_serve_refuses_at_start_with_one_line(tmp_path, monkeypatch, capsys, url, fragment):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "cfg"))  # none of the user's own settings
    config = tmp_path / "relay.json"
    config.write_text(json.dumps({"openai_base_url": url}))
    assert main(["serve", "--listen", "tcp://127.0.0.1:0", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jupyter relay: c.RelayApp.openai_base_url:"), err
    assert fragment in err[0] and PASSWORD not in err[0] and "hunter2" not in err[0]


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JUPYTER_", "ANTHROPIC_", "OPENAI_"))}
    env.update(JUPYTER_CONFIG_DIR=str(tmp / "cfg"), JUPYTER_DATA_DIR=str(tmp / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp / "rt"), IPYTHONDIR=str(tmp / "ipython"))
    return env


def test_relay_serve_process_exits_2_with_one_line(tmp_path):
    config = tmp_path / "relay.json"
    config.write_text(json.dumps({"anthropic_base_url": f"https://me:{PASSWORD}@api.example.com"}))
    out = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "serve", "--listen", "tcp://127.0.0.1:0",
                          "--config", str(config)], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jupyter relay: c.RelayApp.anthropic_base_url: credentials")
    assert PASSWORD not in out.stderr + out.stdout


def test_relay_serve_refuses_a_bad_url_from_the_jupyter_config_files(tmp_path):
    # jupyter relay serve reads c.RelayApp.* from the user's Jupyter config too: the same policy applies
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "jupyter_server_config.py").write_text(
        f"c.RelayApp.openai_base_url = 'http://u:{PASSWORD}@llm.internal:8000/v1'\n")
    out = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "serve", "--listen", "tcp://127.0.0.1:0"],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jupyter relay: c.RelayApp.openai_base_url: credentials")
    assert PASSWORD not in out.stderr + out.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("relay", "setting", "fragment"), [
    ({"openai_base_url": "http://llm.internal:8000/v1"}, "openai_base_url", "allow_insecure_endpoints"),
    ({"anthropic_base_url": f"https://u:{PASSWORD}@api.example.com", "anthropic_api_key": "sk-x-1234567890"},
     "anthropic_base_url", "credentials"),
    ({"openai_base_url": "file:///etc/passwd"}, "openai_base_url", "scheme"),
    ({"openai_base_url": "http://10.1.2.3:8000/v1", "allow_insecure_endpoints": ["http://10.1.2.3"]},
     "allow_insecure_endpoints", "http://host:port"),
])
def test_real_jupyter_server_refuses_to_start_with_one_line(tmp_path, relay, setting, fragment):
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "jupyter_server_config.json").write_text(json.dumps({
        "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}},
        "RelayApp": {"in_memory": True, **relay}}))
    (tmp_path / "root").mkdir()
    out = subprocess.run([sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", "--ip", "127.0.0.1",
                          "--port", "0", f"--ServerApp.root_dir={tmp_path / 'root'}"],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-2000:]
    ours = [line for line in text.splitlines() if "relay: " in line and "ENDPOINT_REFUSED" in line]
    assert len(ours) == 1, text[-2000:]
    assert f"c.RelayApp.{setting}" in ours[0] and fragment in ours[0]
    assert "Traceback" not in text and PASSWORD not in text
    assert "Jupyter Server" not in text or "is running at" not in text  # it never started serving
