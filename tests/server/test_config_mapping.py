"""Configuration once (issue 14 item 5): the ``c.RelayApp`` traits and ``BrokerConfig`` are one list of
settings. Every trait of ``RelayApp`` is a field of ``BrokerConfig`` and every setting (field but the
internal ones) is a trait, with the same default; a non-default value of every trait reaches its field;
the daemon reads the same names from the Jupyter config files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from traitlets import Bool, Dict, Enum, Float, Integer, List, Unicode
from traitlets.config import Config

from relay_jupyter.broker.config import INTERNAL_FIELDS, SETTINGS, BrokerConfig
from relay_jupyter.server.app import RelayApp
from relay_jupyter.server.settings import RelayApp as StandaloneRelayApp
from relay_jupyter.server.jupyter_config import broker_settings_from_files

#: Values that must have a shape (URLs, paths, team lists); any other trait gets a generic non-default value.
SAMPLES: dict[str, Any] = {
    "anthropic_api_key": "sk-ant-mapping-test",
    "openai_api_key": "sk-openai-mapping-test",
    "anthropic_base_url": "https://anthropic.example.test",
    "openai_base_url": "https://openai.example.test/v1",
    "allow_insecure_endpoints": ["http://10.0.0.5:8000"],
    "store_url": "postgresql://relay@127.0.0.1:5432/relay",
    "teams": {"ds": {"members": ["alice"], "tokens_per_day": 1000}},
    "profiles": {"local": {"openai_base_url": "http://127.0.0.1:8080/v1"}},
    "admin_policy": {"models": ["claude-haiku-4-5"], "modes": ["ask"], "max_budget": {"tokens_per_day": 1000}},
    "pricing": {"m-mapped": {"input": 1.0, "output": 2.0}},
    "read_roots": ["."],
    "secret_globs": ["*.kdbx"],
    "default_tools": ["list_variables"],
}


def _config_traits() -> dict[str, Any]:
    # defined once (server/settings.py): the daemon's RelayApp (same c.RelayApp section) has the same own traits, of
    # the same types and defaults, as the extension's
    own = RelayApp.class_own_traits(config=True)
    standalone = StandaloneRelayApp.class_own_traits(config=True)
    assert set(standalone) == set(own)
    assert all(type(standalone[n]) is type(t) and standalone[n].default() == t.default() for n, t in own.items())
    return own


def _plain(value: Any) -> Any:
    """A value as JSON would have it (to compare a trait's value with a field's)."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _sample(name: str, trait: Any) -> Any:
    if name in SAMPLES:
        return SAMPLES[name]
    default = trait.default()
    if isinstance(trait, Bool):
        return not default
    if isinstance(trait, Enum):
        return next(v for v in trait.values if v != default)
    if isinstance(trait, (Float, Integer)):
        return default + 1
    if isinstance(trait, Unicode):
        return f"/tmp/relay-mapping/{name}" if name.endswith(("_file", "_dir", "_path")) else f"mapped-{name}"
    if isinstance(trait, List):
        return [f"mapped-{name}"]
    if isinstance(trait, Dict):
        return {f"mapped-{name}": {}}
    raise AssertionError(f"no sample value for the {type(trait).__name__} trait {name}")


def test_every_trait_is_a_setting_and_every_setting_a_trait():
    traits = set(_config_traits())
    assert traits - set(BrokerConfig.model_fields) == set(), "c.RelayApp traits that BrokerConfig does not have"
    assert set(SETTINGS) - traits == set(), "BrokerConfig settings without a c.RelayApp trait"
    assert set(SETTINGS) | INTERNAL_FIELDS == set(BrokerConfig.model_fields)
    assert not INTERNAL_FIELDS & traits


def test_the_defaults_are_the_same_on_both_sides():
    from_traits = RelayApp().broker_config()
    plain = BrokerConfig()
    differ = {name: (_plain(getattr(from_traits, name)), _plain(getattr(plain, name)))
              for name in SETTINGS if _plain(getattr(from_traits, name)) != _plain(getattr(plain, name))}
    assert not differ, differ


def test_every_trait_reaches_its_field():
    values = {name: _sample(name, trait) for name, trait in _config_traits().items()}
    defaults = RelayApp().broker_config()
    assert all(_plain(v) != _plain(getattr(defaults, n)) for n, v in values.items()), "a sample equals its default"
    built = RelayApp(config=Config({"RelayApp": values})).broker_config()
    wrong = {n: (_plain(getattr(built, n)), _plain(v)) for n, v in values.items() if _plain(getattr(built, n)) != _plain(v)}
    assert not wrong, wrong


def test_an_empty_string_trait_means_not_set():
    built = RelayApp(config=Config({"RelayApp": {"anthropic_api_key": "", "data_dir": "", "store_url": ""}})
                     ).broker_config()
    assert built.anthropic_api_key is None and built.data_dir is None and built.store_url is None


def test_the_daemon_reads_a_setting_that_had_no_trait_before(tmp_path: Path):
    # c.RelayApp.lease_ttl was documented (docs/storage.md) but was not a trait: the files could not set it
    (tmp_path / "jupyter_relay_config.json").write_text(json.dumps({"RelayApp": {"lease_ttl": 45.0,
                                                                                 "storage_check_interval": 0.5}}))
    assert broker_settings_from_files([tmp_path]) == {"lease_ttl": 45.0, "storage_check_interval": 0.5}


async def _grants_defaults(config: BrokerConfig) -> dict[str, Any]:
    from relay_jupyter.broker.broker import Broker
    from relay_jupyter.broker.dispatch import call_method
    from relay_jupyter.core.caller import Caller, CallerKind

    broker = Broker.open(config)
    try:
        kernel = Caller(kind=CallerKind.KERNEL, origin="notebook:a.ipynb", client_id="kernel:k1")
        return await call_method(broker, kernel, "grants.defaults", {})
    finally:
        broker.close()


def test_default_tools_decides_what_the_connect_card_pre_checks():
    import asyncio

    from relay_jupyter.kernel.session import pre_checked
    from relay_jupyter.kernel.widgets.connect_card import ConnectCard

    # grants.defaults carries the setting to the kernel, which renders the card
    assert asyncio.run(_grants_defaults(BrokerConfig(in_memory=True))) == {"tools": ["*"]}
    configured = RelayApp(config=Config({"RelayApp": {"in_memory": True, "default_tools": ["list_variables",
                                                                                           "fs.read_file"]}}))
    answer = asyncio.run(_grants_defaults(configured.broker_config()))
    assert answer["tools"] == ["list_variables", "fs.read_file"]

    offered = [{"name": n, "class": "read"} for n in ("list_variables", "scratch_write", "fs.read_file")]

    async def card_checks(checked: list[str] | None) -> list[bool]:
        card = ConnectCard("claude-x", offered, {}, checked=checked)
        return [c.value for c in card.checks]

    assert asyncio.run(card_checks(answer["tools"])) == [True, False, True]
    assert asyncio.run(card_checks(["*"])) == [True, True, True]  # the default: every tool, as before
    assert asyncio.run(card_checks(None)) == [True, True, True]   # an older broker sends none
    assert asyncio.run(card_checks([])) == [False, False, False]
    # the input() prompt grants what the card would have pre-checked
    assert [t["name"] for t in offered if pre_checked(answer["tools"], t["name"])] == \
        ["list_variables", "fs.read_file"]
