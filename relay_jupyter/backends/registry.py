"""The one list of model backends: each declares, in one place, its name, its settings model, the
environment variables that hold its key, the one-line hint shown when it is not configured, and the
factory that builds it.

Everything else takes the list from here: ``run.start``'s ``backend`` Literal (the plain names live in
``protocol/run_choices.BACKEND_NAMES``, since the wire layer must not import backends; this module
asserts at import that the two lists are the same), ``BrokerConfig.default_backend``,
``c.RelayApp.default_backend``, the ``%%agent --backend`` choices, :class:`~relay_jupyter.backends.keys.KeySource`'s
environment names, the variables scrubbed from every kernel, and the broker's ``backends_from_config``.

Adding a backend: its module under ``backends/``, one :class:`BackendSpec` in :data:`BACKENDS`, its name in
``BACKEND_NAMES``. Factories import their SDK lazily (the broker starts without the anthropic SDK
loaded when only a local server is configured).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, SecretStr

from ..core.errors import Code
from ..protocol.run_choices import BACKEND_NAMES

if TYPE_CHECKING:
    from .base import Backend
    from .keys import KeySource

__all__ = [
    "AnthropicSettings",
    "BACKENDS",
    "BackendSpec",
    "DemoSettings",
    "EndpointCheck",
    "OpenAISettings",
    "build_backends",
    "build_upstream_backend",
    "key_env_names",
    "secret_env_names",
    "spec",
]

EndpointCheck = Callable[[str, str], str]
"""``check(url, setting) -> url``: the endpoint policy for a model base URL (the broker passes
``mcp.policy.check_model_endpoint`` bound to its ``allow_insecure_endpoints``); raises ConfigRefusal."""


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AnthropicSettings(_Settings):
    """``c.RelayApp.anthropic_api_key`` (or the secrets file, or ``$ANTHROPIC_API_KEY``) and
    ``anthropic_base_url`` (or the server's ``$ANTHROPIC_BASE_URL``, checked by the same policy)."""

    api_key: SecretStr
    base_url: str | None = None
    models: tuple[str, ...] = ("claude-*",)


class OpenAISettings(_Settings):
    """``c.RelayApp.openai_base_url`` (an OpenAI-compatible server) and its optional key."""

    base_url: str
    api_key: SecretStr | None = None
    models: tuple[str, ...] = ("*",)


class DemoSettings(_Settings):
    """The demo backend has no settings: it is installed only when no other backend is configured."""


@dataclass(frozen=True)
class BackendSpec:
    """Everything relay knows about one backend."""

    name: str
    settings: type[_Settings]
    key_env: str | None
    """The server environment variable :class:`KeySource` reads last for this backend's key."""
    secret_env: tuple[str, ...]
    """Every environment variable that may hold this backend's credentials: never handed to a kernel
    (``BrokerConfig.secret_env_vars``) nor to an engine's subprocess."""
    missing_code: Code
    missing_hint: str
    """``run.start`` naming this backend on a server that has not configured it: the one-line error."""
    configure: Callable[[Any, KeySource, EndpointCheck], _Settings | None]
    """``(BrokerConfig, keys, check) -> settings`` or None when the configuration does not enable it."""
    factory: Callable[[Any], Backend]
    """``settings -> Backend``."""
    fallback: bool = False
    """Installed only when no other backend is configured (the demo)."""


def _allowed(config: Any) -> tuple[str, ...] | None:
    return tuple(getattr(config, "allowed_models", ()) or ()) or None


def _configure_anthropic(config: Any, keys: KeySource, check: EndpointCheck) -> AnthropicSettings | None:
    import os

    key = keys.get("anthropic")
    # every model URL follows the endpoint policy (BrokerConfig checks the configured ones; the SDK
    # would also read $ANTHROPIC_BASE_URL, so that one is checked here, and passed explicitly)
    url = config.anthropic_base_url
    if url:
        check(url, "c.RelayApp.anthropic_base_url")
    elif key is not None and os.environ.get("ANTHROPIC_BASE_URL"):
        url = check(os.environ["ANTHROPIC_BASE_URL"], "$ANTHROPIC_BASE_URL (the server's environment)")
    if key is None:
        return None
    allowed = _allowed(config)
    return AnthropicSettings(api_key=SecretStr(key.reveal()), base_url=url or None,
                             **({"models": allowed} if allowed else {}))


def _anthropic(settings: AnthropicSettings) -> Backend:
    from .anthropic import AnthropicBackend

    return AnthropicBackend(settings.api_key.get_secret_value(), base_url=settings.base_url,
                            models=settings.models)


def _configure_openai(config: Any, keys: KeySource, check: EndpointCheck) -> OpenAISettings | None:
    if not config.openai_base_url:
        return None
    check(config.openai_base_url, "c.RelayApp.openai_base_url")
    key = keys.get("openai")
    allowed = _allowed(config)
    return OpenAISettings(base_url=config.openai_base_url, api_key=SecretStr(key.reveal()) if key else None,
                          **({"models": allowed} if allowed else {}))


def _openai(settings: OpenAISettings) -> Backend:
    from .openai import OpenAIBackend

    return OpenAIBackend(settings.base_url, settings.api_key.get_secret_value() if settings.api_key else None,
                         models=settings.models)


def _configure_demo(config: Any, keys: KeySource, check: EndpointCheck) -> DemoSettings | None:
    return None  # never configured: the fallback of build_backends' caller (broker/assembly)


def _demo(settings: DemoSettings) -> Backend:
    from .demo import DemoBackend

    return DemoBackend()


#: Every backend, in the order ``BACKEND_NAMES`` lists them (the first configured one is the
#: default when ``default_backend`` is not configured).
BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec(
        name="anthropic", settings=AnthropicSettings, key_env="ANTHROPIC_API_KEY",
        secret_env=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "RELAY_ANTHROPIC_API_KEY"),
        missing_code=Code.NO_CREDENTIALS,
        missing_hint="no Anthropic API key is configured for this server (server config, the 0600 "
                     "secrets file or $ANTHROPIC_API_KEY of the server)",
        configure=_configure_anthropic, factory=_anthropic),
    BackendSpec(
        name="openai", settings=OpenAISettings, key_env="OPENAI_API_KEY",
        secret_env=("OPENAI_API_KEY", "RELAY_OPENAI_API_KEY"),
        missing_code=Code.NO_BACKEND,
        missing_hint="no OpenAI-compatible endpoint is configured for this server (openai_base_url)",
        configure=_configure_openai, factory=_openai),
    BackendSpec(
        name="demo", settings=DemoSettings, key_env=None, secret_env=(),
        missing_code=Code.NO_BACKEND,
        missing_hint="the demo backend runs only on a server with no model backend configured",
        configure=_configure_demo, factory=_demo, fallback=True),
)

_BY_NAME: dict[str, BackendSpec] = {s.name: s for s in BACKENDS}

# the wire's Literal and this registry are one list (a backend added in one place only fails here, at import)
assert tuple(_BY_NAME) == BACKEND_NAMES, (tuple(_BY_NAME), BACKEND_NAMES)


def spec(name: str) -> BackendSpec | None:
    """The backend called ``name``, or None."""
    return _BY_NAME.get(name)


def key_env_names() -> Mapping[str, str]:
    """``{backend: env var}`` that :class:`KeySource` consults last."""
    return {s.name: s.key_env for s in BACKENDS if s.key_env}


def secret_env_names() -> tuple[str, ...]:
    """Every backend credential variable, in registry order (no duplicates)."""
    return tuple(dict.fromkeys(name for s in BACKENDS for name in s.secret_env))


def build_backends(config: Any, keys: KeySource, check: EndpointCheck) -> dict[str, Backend]:
    """The backends ``config`` enables, in registry order (fallbacks excluded)."""
    out: dict[str, Backend] = {}
    for s in BACKENDS:
        if s.fallback:
            continue
        settings = s.configure(config, keys, check)
        if settings is not None:
            out[s.name] = s.factory(settings)
    return out


def build_upstream_backend(name: str, config: Any, base_url: str, key: str | None) -> Backend:
    """The backend ``name`` (``anthropic`` | ``openai``) over a given upstream: a profile's base URL and its key
    (broker/profiles.py; the URL was checked by the endpoint policy at start). Same settings and factory as
    :func:`build_backends`: the one way a backend is built.

    Raises:
        ConfigRefusal: NO_BACKEND (not a model wire), NO_CREDENTIALS (an Anthropic upstream without a key).
    """
    from ..core.errors import ConfigRefusal

    allowed = _allowed(config)
    models = {"models": allowed} if allowed else {}
    if name == "anthropic":
        if not key:
            raise ConfigRefusal(Code.NO_CREDENTIALS, "no Anthropic API key for this upstream")
        settings: _Settings = AnthropicSettings(api_key=SecretStr(key), base_url=base_url, **models)
    elif name == "openai":
        settings = OpenAISettings(base_url=base_url, api_key=SecretStr(key) if key else None, **models)
    else:
        raise ConfigRefusal(Code.NO_BACKEND, f"the {name!r} backend has no upstream URL")
    return _BY_NAME[name].factory(settings)


def fallback_backends() -> dict[str, Backend]:
    """The backends installed when none is configured (the demo)."""
    return {s.name: s.factory(s.settings()) for s in BACKENDS if s.fallback}
