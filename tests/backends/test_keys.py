"""Keys come from the server config, a 0600 secrets file, or the server's environment; never shown."""

from __future__ import annotations

import json
import os

import pytest

from relay_jupyter.backends.keys import KeySource, Secret
from relay_jupyter.core.errors import ConfigRefusal


def secrets_file(tmp_path, mode=0o600, data=None):
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps(data if data is not None else {"anthropic": "sk-ant-file"}))
    os.chmod(path, mode)
    return path


def test_order_config_then_file_then_env(tmp_path):
    path = secrets_file(tmp_path)
    env = {"ANTHROPIC_API_KEY": "sk-ant-env", "OPENAI_API_KEY": "sk-env-openai"}
    assert KeySource({"anthropic": "sk-ant-config"}, path, env).get("anthropic").reveal() == "sk-ant-config"
    assert KeySource({}, path, env).get("anthropic").reveal() == "sk-ant-file"
    assert KeySource({}, path, env).get("openai").reveal() == "sk-env-openai"
    assert KeySource({}, None, {}).get("anthropic") is None
    assert KeySource({}, tmp_path / "absent.json", {}).get("anthropic") is None


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_group_or_world_readable_file_refused_with_the_fix(tmp_path, mode):
    path = secrets_file(tmp_path, mode)
    with pytest.raises(ConfigRefusal) as info:
        KeySource(secrets_file=path, env={}).get("anthropic")
    assert info.value.code.value == "NO_CREDENTIALS"
    assert "chmod 600" in info.value.message and "sk-ant" not in info.value.message


def test_symlink_and_bad_json_refused_without_echoing(tmp_path):
    real = secrets_file(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(ConfigRefusal):
        KeySource(secrets_file=link, env={}).get("anthropic")
    bad = tmp_path / "bad.json"
    bad.write_text('{"anthropic": "sk-ant-half')
    os.chmod(bad, 0o600)
    with pytest.raises(ConfigRefusal) as info:
        KeySource(secrets_file=bad, env={}).get("anthropic")
    assert "sk-ant" not in str(info.value)


def test_missing_key_is_one_clear_message():
    with pytest.raises(ConfigRefusal) as info:
        KeySource(env={}).require("anthropic")
    assert "ANTHROPIC_API_KEY" in info.value.message


def test_secret_is_never_printed():
    s = Secret("sk-ant-verysecret")
    assert "verysecret" not in repr(s) + str(s) + f"{s}" + repr([s])
    source = KeySource({"anthropic": "sk-ant-verysecret"}, env={})
    assert "verysecret" not in repr(source)
