"""The backend registry is the one list: the wire Literal, the config, the traitlet, the magic, the key
environment names and the scrubbed variables all come from it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relay_jupyter.backends import registry
from relay_jupyter.backends.keys import ENV_NAMES, KeySource
from relay_jupyter.broker.config import DEFAULT_SECRET_ENV_VARS, BrokerConfig
from relay_jupyter.broker.runtime_setup import backends_from_config
from relay_jupyter.kernel.errors import AgentUsageError
from relay_jupyter.kernel.magics import USAGE, parse_line
from relay_jupyter.protocol.models_runs import RunStartParams
from relay_jupyter.protocol.run_choices import BACKEND_NAMES


def test_every_surface_takes_the_registry_list():
    names = tuple(s.name for s in registry.BACKENDS)
    assert names == BACKEND_NAMES == ("anthropic", "openai", "demo")
    for name in names:
        assert RunStartParams(conversation="c", prompt="p", backend=name).backend == name
        assert BrokerConfig(default_backend=name).default_backend == name
        assert parse_line(f"--backend {name}", "hi").backend == name
    assert f"--backend {'|'.join(names)}" in USAGE
    with pytest.raises(ValidationError):
        RunStartParams(conversation="c", prompt="p", backend="bogus")
    with pytest.raises(ValidationError):
        BrokerConfig(default_backend="bogus")
    with pytest.raises(AgentUsageError):
        parse_line("--backend bogus", "hi")


def test_the_traitlet_takes_the_registry_list():
    from relay_jupyter.server.app import RelayApp

    assert tuple(RelayApp.class_traits()["default_backend"].values) == BACKEND_NAMES


def test_key_env_names_and_scrubbed_variables_come_from_the_registry():
    assert ENV_NAMES == {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
    for s in registry.BACKENDS:
        assert set(s.secret_env) <= set(DEFAULT_SECRET_ENV_VARS), s.name
        if s.key_env:
            assert s.key_env in s.secret_env  # the variable KeySource reads is never handed to a kernel
    assert KeySource(env={"OPENAI_API_KEY": "sk-o"}).get("openai").reveal() == "sk-o"


def test_build_backends_follows_the_config_in_registry_order(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    assert backends_from_config(BrokerConfig()) == {}
    both = backends_from_config(BrokerConfig(anthropic_api_key="sk-ant-x1234567890",
                                             openai_base_url="http://127.0.0.1:9/v1",
                                             allowed_models=("m1",)))
    assert list(both) == ["anthropic", "openai"]
    assert both["openai"].allows_model("m1") and not both["openai"].allows_model("m2")
    assert both["anthropic"].allows_model("m1") and not both["anthropic"].allows_model("claude-x")
    # the demo is never built from a config: only as the fallback when nothing is configured
    assert list(registry.fallback_backends()) == ["demo"]


def test_every_spec_has_a_one_line_hint_and_a_settings_model():
    for s in registry.BACKENDS:
        assert s.missing_hint and "\n" not in s.missing_hint
        assert registry.spec(s.name) is s
    assert registry.spec("bogus") is None
    with pytest.raises(ValidationError):  # settings models are strict
        registry.OpenAISettings(base_url="http://127.0.0.1:9", surprise=1)


def test_engine_names_come_from_one_list_too():
    from relay_jupyter.engines.registry import ENGINES
    from relay_jupyter.protocol.run_choices import ENGINE_NAMES
    from relay_jupyter.server.app import RelayApp

    assert tuple(s.name for s in ENGINES) == ENGINE_NAMES == ("relay", "claude-code")
    assert tuple(RelayApp.class_traits()["default_engine"].values) == ENGINE_NAMES
    for name in ENGINE_NAMES:
        assert parse_line(f"--engine {name}", "hi").engine == name
        assert RunStartParams(conversation="c", prompt="p", engine=name).engine == name
        assert BrokerConfig(default_engine=name).default_engine == name
    assert parse_line("", "hi").engine is None and BrokerConfig().default_engine == "relay"
    assert f"--engine {'|'.join(ENGINE_NAMES)}" in USAGE
    with pytest.raises(AgentUsageError):
        parse_line("--engine bogus", "hi")
    with pytest.raises(ValidationError):
        RunStartParams(conversation="c", prompt="p", engine="bogus")
