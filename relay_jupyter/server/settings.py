"""Every broker setting as a traitlets trait, without the Jupyter server: ``c.RelayApp.<name>``.

The traits are defined once, here (:func:`setting_traits`), and are the own traits of two classes that both read
the ``c.RelayApp`` section:

- :class:`~relay_jupyter.server.app.RelayApp`, the Jupyter server extension;
- :class:`RelayApp` below, with which the standalone daemon and ``jupyter relay`` read the user's settings
  (``server/jupyter_config.py``, ``cli/app.py``): the same trait types, defaults, help and validation.

Why a module of its own: importing ``server/app.py`` imports ``jupyter_server`` (its ``ServerApp``, jupyter_events
and jsonschema's format checkers), which took seconds of a daemon's start before its socket answered, for settings
the daemon only reads (issue 19, ``benchmarks/README.md`` "Daemon start";
``tests/daemon/test_daemon_start_imports.py``).

Why fresh instances per class rather than a mixin holding them: traitlets lists a class's *own* traits in
``--generate-config`` and ``--help-all`` (``class_own_traits``), and a non-``Configurable`` mixin's traits are
nobody's own, so ``c.RelayApp.*`` would have vanished from ``jupyter server --generate-config``. Each class body
adds them with ``locals().update(setting_traits())``: a class body's ``locals()`` is its namespace (PEP 667 keeps
that so), and traitlets sets up every trait found there as it does for one written out.
"""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Dict, Enum, Float, HasTraits, Integer, List, TraitType, Unicode
from traitlets.config import Configurable

from ..broker.config import DEFAULT_SECRET_ENV_VARS, SETTINGS, BrokerConfig
from ..protocol.run_choices import BACKEND_NAMES, ENGINE_NAMES

__all__ = ["RelayApp", "broker_config_of", "setting_traits"]


def _setting(name: str, value: Any) -> Any:
    """A trait's value as its ``BrokerConfig`` field takes it: an empty string is "not set" (None) for a field
    that may be None (paths, URLs, keys); lists become tuples; pydantic does the rest (str -> Path, SecretStr)."""
    field = BrokerConfig.model_fields[name]
    if value == "" and field.default is None:
        return None
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def setting_traits() -> dict[str, TraitType[Any, Any]]:
    """A new trait per broker setting (``c.RelayApp.<name>``), for the class body of a class named ``RelayApp``.

    Every ``BrokerConfig`` setting (``broker.config.SETTINGS``) has one, with the field's default
    (``tests/server/test_config_mapping.py``)."""
    return {
        "consent_timeout": Float(300.0, config=True, help="Seconds a permission request waits before it is denied."),
        "kernel_tool_timeout": Float(60.0, config=True, help="Seconds to wait for a kernel to answer a kernel tool."),
        "heartbeat_interval": Float(15.0, config=True, help="Seconds between SSE heartbeat comments."),
        "event_retention_seconds": Float(7 * 86_400.0, config=True, help="Events older than this are pruned."),
        "event_retention_count": Integer(1_000_000, config=True, help="At most this many events are kept."),
        "telemetry_retention_seconds": Float(90 * 86_400.0, config=True,
                                             help="Telemetry rows (one per model request) older than this are pruned."),
        "max_body_bytes": Integer(1 << 20, config=True, help="Largest RPC body; larger gets HTTP 413."),
        "sse_queue_size": Integer(2_000, config=True, help="Events buffered per SSE subscriber before it is dropped."),
        "anthropic_api_key": Unicode("", config=True,
                                     help="Anthropic API key (else the secrets file or ANTHROPIC_API_KEY). Never "
                                          "given to a kernel."),
        "anthropic_base_url": Unicode("", config=True, help="Anthropic API base URL (tests, proxies)."),
        "openai_base_url": Unicode("", config=True,
                                   help="OpenAI-compatible server (Ollama, vLLM, llama.cpp, LM Studio), e.g. "
                                        "http://127.0.0.1:11434/v1"),
        "openai_api_key": Unicode("", config=True, help="Key for the OpenAI-compatible server, if it needs one."),
        "allow_insecure_endpoints": List(Unicode(), config=True,
                                         help='Model servers reachable over plain http although not loopback, as '
                                              '"http://host:port" (the API key then travels in clear text).'),
        "turn_timeout": Float(300.0, config=True,
                              help="Seconds one model turn may take in all (then BACKEND_TIMEOUT)."),
        "turn_idle_timeout": Float(120.0, config=True,
                                   help="Seconds a model turn may go without content; keep-alive pings do not count."),
        "secrets_file": Unicode("", config=True, help="A 0600 file holding keys; refused when others can read it."),
        "mcp_config_path": Unicode("", config=True, help="Path of mcp.json (MCP servers to connect)."),
        "lease_ttl": Float(30.0, config=True, help="Seconds a broker's lease in the store lives without renewal; then "
                                                   "another broker treats its runs as a dead broker's."),
        "storage_check_interval": Float(2.0, config=True,
                                        help="Seconds between storage probes while the store cannot be written."),
        "store_url": Unicode("", config=True,
                             help="postgresql://user@host:port/db: a PostgreSQL store shared by several brokers "
                                  "(pip install relay-jupyter[postgres]; never with a password). Empty: SQLite in "
                                  "data_dir."),
        "store_password_file": Unicode("", config=True, help="A 0600 file holding the database password of store_url."),
        "teams": Dict(config=True, help="Team budgets: {name: {members: [user, ...], tokens_per_day, cost_per_day_usd, "
                                        "tokens_per_month, cost_per_month_usd}} (docs/multi-user.md)."),
        "profiles": Dict(config=True, help="Named upstreams of the model endpoints: {name: {anthropic_base_url, "
                                           "openai_base_url, anthropic_key, openai_key}}; keys from the secrets file "
                                           "(<name>.anthropic / <name>.openai); docs/proxy.md."),
        "user": Unicode("", config=True, help="The user whose teams this server's notebooks draw from "
                                               "(default: $JUPYTERHUB_USER, else the login name)."),
        "admin_policy": Dict(config=True, help="What the administrator allows at most: {models: [...], tools: [...], "
                                               "modes: [ask, review, full], max_budget: {tokens_per_day, ...}}; every "
                                               "grant is narrowed by it (docs/multi-user.md)."),
        "hub_service_url": Unicode("", config=True,
                                   help="http://host:port/services/<name>/ of the relay JupyterHub service (else "
                                        "$RELAY_HUB_SERVICE_URL): this server is then a thin client, with no broker, "
                                        "keys or store of its own (docs/multi-user.md)."),
        "pricing": Dict(config=True, help="Per-model price overrides, USD per million tokens: "
                                           "{model: {input, output, cache_write, cache_read}}."),
        "default_model": Unicode("claude-sonnet-4-5", config=True, help="Model used when a run names none."),
        "default_backend": Enum(list(BACKEND_NAMES), "anthropic", config=True, help="Backend used by default."),
        "default_engine": Enum(list(ENGINE_NAMES), "relay", config=True,
                               help="Engine of a run that names none: relay (built-in loop) or claude-code "
                                    "(pip install relay-jupyter[claude-code]; docs/engines.md)."),
        "allowed_models": List(Unicode(), config=True,
                               help="Models the broker allows at all (empty: any a grant names)."),
        "default_tools": List(Unicode(), ["*"], config=True,
                              help="Tools the connect card pre-checks: tool names, or '*' for every tool offered "
                                   "(the user can still untick them)."),
        "secret_env_vars": List(Unicode(), list(DEFAULT_SECRET_ENV_VARS), config=True,
                                help="Environment variables removed from every kernel's environment."),
        "data_dir": Unicode("", config=True, help="Where the relay database and audit log live "
                                                  "(default: <jupyter data dir>/relay)."),
        "in_memory": Bool(False, config=True, help="Keep grants, events and audit in memory only (tests)."),
        "read_roots": List(Unicode(), ["{notebook_dir}"], config=True,
                           help="Directories relative to the Jupyter root that scratch_pull reads without a card "
                                "('{notebook_dir}': the notebook's own directory; '.': the whole root; empty: "
                                "every pull asks). Credential stores are refused everywhere."),
        "secret_globs": List(Unicode(), [], config=True,
                             help="More credential globs (e.g. '*.kdbx', 'private/*') that pull and push refuse "
                                  "even with approval."),
    }


def broker_config_of(settings: HasTraits) -> BrokerConfig:
    """The traits of ``settings`` as a validated :class:`BrokerConfig`: every setting (``broker.config.SETTINGS``,
    the model's fields) is read from the trait of the same name, so none can be left out of the mapping
    (``tests/server/test_config_mapping.py``)."""
    return BrokerConfig(**{name: _setting(name, getattr(settings, name)) for name in SETTINGS})


class RelayApp(Configurable):
    """The ``c.RelayApp`` section outside Jupyter: the daemon and ``jupyter relay`` read the user's settings with it
    (named as the extension's class: traitlets picks a config section by the class name)."""

    locals().update(setting_traits())

    def broker_config(self) -> BrokerConfig:
        """The settings as a validated :class:`BrokerConfig` (:func:`broker_config_of`)."""
        return broker_config_of(self)
