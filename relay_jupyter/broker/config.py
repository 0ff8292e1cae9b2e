"""Broker configuration: one pydantic model built at the edge (traitlets in ``server/app.py``,
command-line flags in the daemon) and handed to :class:`relay_jupyter.broker.broker.Broker`.

Every field but :data:`INTERNAL_FIELDS` is a setting (:data:`SETTINGS`): ``c.RelayApp.<name>`` inside Jupyter and in
the Jupyter config files the daemon reads, ``"<name>"`` in the daemon's ``--config`` JSON. ``RelayApp.broker_config``
reads exactly these names from its traits (``tests/server/test_config_mapping.py`` checks that every trait is a
field and every setting a trait, with the same default).

Secrets are ``SecretStr`` so that a ``repr``, a log line or a ``model_dump`` never shows them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from ..backends.registry import secret_env_names
from ..core.errors import Code, ConfigRefusal
from ..protocol.run_choices import BackendName, EngineName

__all__ = ["DEFAULT_SECRET_ENV_VARS", "INTERNAL_FIELDS", "SETTINGS", "BrokerConfig", "check_private_file"]

#: Environment variables never handed to a kernel: model keys (each backend's, declared in
#: ``backends/registry.py``) and every Jupyter/JupyterHub token.
DEFAULT_SECRET_ENV_VARS: tuple[str, ...] = (
    *secret_env_names(),
    "RELAY_TOKEN",
    "JUPYTER_TOKEN",
    "JUPYTER_PASSWORD",
    "JPY_API_TOKEN",
    "JUPYTERHUB_API_TOKEN",
)


def check_private_file(path: Path) -> Path:
    """Refuse a secrets file that another user could read or write.

    Raises:
        ConfigRefusal: CONFIG_INVALID when the file is missing, not a regular file, or group/world accessible.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"secrets file {path} does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigRefusal(Code.CONFIG_INVALID, f"secrets file {path} is not a regular file")
    if st.st_mode & 0o077:
        raise ConfigRefusal(
            Code.CONFIG_INVALID,
            f"secrets file {path} is readable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"run: chmod 600 {path}",
        )
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ConfigRefusal(Code.CONFIG_INVALID, f"secrets file {path} is owned by another user")
    return path


class BrokerConfig(BaseModel):
    """Everything the broker needs to know, with safe defaults (every wait finite)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: Path | None = None
    """Where the SQLite store and audit log live; None = ``<jupyter data dir>/relay``."""
    in_memory: bool = False
    """Use the in-memory ports (tests, benchmarks); nothing is written to disk."""
    audit_file: str = Field("audit.jsonl", pattern=r"^[A-Za-z0-9_.-]{1,64}\.jsonl$")
    """Audit log file name in the data dir. The standalone daemon writes ``audit-daemon.jsonl`` so that it
    can run beside a relay-enabled Jupyter server on the same data dir (one writer per audit log)."""
    consent_timeout: float = Field(300.0, gt=0, le=86_400)
    """Seconds a permission request waits for its originator before it is denied (PERMISSION_TIMEOUT)."""
    kernel_tool_timeout: float = Field(60.0, gt=0, le=3_600)
    """Seconds the broker waits for a kernel to answer a kernel-tool request."""
    heartbeat_interval: float = Field(15.0, gt=0, le=3_600)
    """Seconds between SSE heartbeat comments."""
    event_retention_seconds: float = Field(7 * 86_400.0, gt=0)
    event_retention_count: int = Field(1_000_000, gt=0)
    telemetry_retention_seconds: float = Field(90 * 86_400.0, gt=0)
    max_body_bytes: int = Field(1 << 20, gt=0)
    """Largest RPC body accepted; larger gets HTTP 413 before it is read whole."""
    sse_queue_size: int = Field(2_000, gt=0)
    """Events buffered per live subscriber; a subscriber further behind is disconnected."""
    anthropic_api_key: SecretStr | None = None
    anthropic_base_url: str | None = None
    openai_base_url: str | None = None
    openai_api_key: SecretStr | None = None
    allow_insecure_endpoints: tuple[str, ...] = ()
    """``http://host:port`` entries a model base URL may reach over plain http although they are not
    loopback (the API key then travels in clear text). Everything else needs https or loopback."""
    turn_timeout: float = Field(300.0, gt=0, le=86_400)
    """Seconds one model turn may take in all (pings and trickled words do not extend it): BACKEND_TIMEOUT."""
    turn_idle_timeout: float = Field(120.0, gt=0, le=86_400)
    """Seconds a model turn may go without content (keep-alive pings do not count): BACKEND_TIMEOUT."""
    lease_ttl: float = Field(30.0, ge=1, le=3_600)
    """Seconds a broker's lease in the store lives without renewal (renewed every third of it); after
    that, a broker on another host treats its runs as a dead broker's (docs/storage.md)."""
    storage_check_interval: float = Field(2.0, gt=0, le=3_600)
    """Seconds between storage probes while the store cannot be written (readyz is 503 meanwhile)."""
    secrets_file: Path | None = None
    """A 0600 file with keys (read by ``backends/keys.py``); refused when group/world accessible."""
    mcp_config_path: Path | None = None
    store_url: str | None = None
    """``postgresql://user@host:port/db``: a PostgreSQL store shared by several brokers (docs/multi-user.md);
    None: the SQLite file in ``data_dir``. Never with a password (it is refused: URLs end up in logs)."""
    store_password_file: Path | None = None
    """A 0600 file holding only the database password of ``store_url`` (else the secrets file's
    ``store_password``, else libpq's ``~/.pgpass``)."""
    teams: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Team budgets: ``{name: {members: [user, ...], tokens_per_day, cost_per_day_usd, tokens_per_month,
    cost_per_month_usd}}`` (core/teams.py). Members' notebooks draw from them together."""
    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Named upstreams for the model endpoints: ``{name: {anthropic_base_url?, openai_base_url?,
    anthropic_key?, openai_key?, description?}}``; keys from the secrets file only (broker/profiles.py,
    docs/proxy.md). A grant lists the profiles its origin may use."""
    user: str | None = None
    """The user this broker's notebooks belong to (team membership); None: ``$JUPYTERHUB_USER``, else the
    login name. Origins ``user:<name>/...`` name their own user."""
    admin_policy: dict[str, Any] = Field(default_factory=dict)
    """What an administrator allows at most (core/admin_policy.py): ``{models, tools, modes, max_budget}``;
    every grant is narrowed by it when read, and a run in a mode it leaves out is refused."""
    hub_service_url: str | None = None
    """``http://host:port/services/<name>/``: the JupyterHub service that is the hub's one broker
    (server/hub_service.py). Set (or ``$RELAY_HUB_SERVICE_URL``), a single-user server's extension is a
    thin client: no broker, no keys, no store; its kernels talk to the service with the user's hub token."""
    read_roots: tuple[str, ...] = ("{notebook_dir}",)
    """Directories (relative to the Jupyter root) a ``scratch_pull`` reads without a card; elsewhere a pull
    is a write (one click). ``{notebook_dir}``: the calling notebook's own directory (daemon clients have
    none); ``.``: the whole root; empty: every pull asks. See docs/workspace.md."""
    secret_globs: tuple[str, ...] = ()
    """More credential globs refused for pull and push even with approval (beside the built-in
    ``.ssh/``, ``.env``, ``*.pem``...); without ``/`` a glob matches any path component."""
    pricing: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Per-model price overrides (USD per million tokens), merged over the defaults."""
    default_model: str = "claude-sonnet-4-5"
    default_backend: BackendName = "anthropic"
    default_engine: EngineName = "relay"
    """Engine of a run that names none (``relay``: the built-in loop; ``claude-code``: docs/engines.md)."""
    allowed_models: tuple[str, ...] = ()
    """Models the broker allows at all ('' = every model a grant names)."""
    default_tools: tuple[str, ...] = ("*",)
    """Tools the connect card pre-checks (``grants.defaults`` returns them): exact tool names,
    ``*`` for every tool offered (the default). The user can still tick or untick each one before Connect."""
    secret_env_vars: tuple[str, ...] = DEFAULT_SECRET_ENV_VARS
    """Environment variables scrubbed from every kernel's environment."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Settings of components wired later (runtime, MCP), passed through untouched."""

    @model_validator(mode="after")
    def _store_and_teams(self) -> BrokerConfig:
        """A store URL without a password and a valid team list, else refused at start in one line."""
        if self.store_url is not None:
            from urllib.parse import parse_qs, urlsplit

            parts = urlsplit(self.store_url)
            if parts.scheme not in ("postgresql", "postgres"):
                raise ConfigRefusal(Code.CONFIG_INVALID, "c.RelayApp.store_url must be a postgresql://user@host:port/db URL")
            if parts.password or "password" in parse_qs(parts.query):
                raise ConfigRefusal(Code.CONFIG_INVALID, "c.RelayApp.store_url carries a password: remove it and put "
                                    "it in c.RelayApp.store_password_file (mode 0600) or the secrets file's store_password")
        if self.teams:
            from ..core.teams import Teams

            try:
                Teams.from_config(self.teams)
            except ValueError as exc:
                raise ConfigRefusal(Code.CONFIG_INVALID, f"c.RelayApp.teams: {exc}") from None
        if self.admin_policy:
            from ..core.admin_policy import AdminPolicy

            try:
                AdminPolicy.from_config(self.admin_policy)
            except ValueError as exc:
                raise ConfigRefusal(Code.CONFIG_INVALID, f"c.RelayApp.{exc}") from None
        return self

    @model_validator(mode="after")
    def _endpoint_policy(self) -> BrokerConfig:
        """Model base URLs follow the endpoint policy (https, or http to loopback, or listed in
        ``allow_insecure_endpoints``; no credentials; http(s) only): refused at start, one line."""
        from ..mcp.policy import check_model_endpoint, parse_insecure_endpoints

        allowed = parse_insecure_endpoints(self.allow_insecure_endpoints)
        for setting in ("anthropic_base_url", "openai_base_url"):
            url = getattr(self, setting)
            if url is not None:
                check_model_endpoint(url, f"c.RelayApp.{setting}", allow_insecure=allowed)
        if self.profiles:
            from .profiles import parse_profiles

            parse_profiles(self.profiles, allowed)  # every profile URL under the same policy
        return self

    def secret_values(self) -> list[str]:
        """Every configured secret value (to scrub from kernel environments by value). Never log these."""
        out = []
        for secret in (self.anthropic_api_key, self.openai_api_key):
            if secret is not None and secret.get_secret_value():
                out.append(secret.get_secret_value())
        return out


#: Fields that are not settings: chosen by the process that builds the broker (the daemon's own audit file
#: name) or handed through to components (``extra``).
INTERNAL_FIELDS = frozenset({"audit_file", "extra"})

#: The settings, in field order: each is ``c.RelayApp.<name>`` (a trait of ``server/app.RelayApp``).
SETTINGS: tuple[str, ...] = tuple(name for name in BrokerConfig.model_fields if name not in INTERNAL_FIELDS)
