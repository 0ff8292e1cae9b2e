"""``mcp.json``: which MCP servers the broker connects, in the Claude Desktop format.

::

    {"mcpServers": {
        "time":   {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "env": {}},
        "remote": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ..."}}
    }}

The file lives in the Jupyter config dir (``storage.paths.config_dir() / "mcp.json"``) unless a
path is configured. Parsing is forgiving per entry and strict inside one: a bad entry disables
that server with a one-line message in :attr:`McpConfig.problems`, the others still work; a file
that is not JSON at all disables every server (problem under the key ``""``).

Accepted per-entry keys: ``command``, ``args``, ``env``, ``cwd`` (stdio); ``url``, ``headers``
(Streamable HTTP; and for the OAuth ``client_credentials`` grant ``client_id``, ``issuer``,
``client_secret_entry``, ``scope``, ``token_auth``: the secret itself only in the secrets file); and ``type`` (``stdio`` | ``http`` | ``streamable-http``), ``disabled``,
``timeout`` (per-call seconds). Unknown keys are refused, so a typo never silently drops a setting.
Header and env *values* are secrets: they never appear in a message, a log line or ``repr``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..core.errors import Code, ConfigRefusal
from ..core.redact import mask_argv, mask_secret_text
from ..storage.paths import config_dir
from .policy import check_endpoint, check_headers

__all__ = [
    "MAX_CONFIG_BYTES",
    "HttpServerConfig",
    "McpConfig",
    "ServerConfig",
    "StdioServerConfig",
    "default_config_path",
    "load_config",
    "parse_config",
]

MAX_CONFIG_BYTES = 1 << 20
MAX_SERVERS = 64
#: No ``__`` and no trailing ``_``: ``<server>__<tool>`` must split back at its first ``__`` into exactly that
#: server (server ``a_`` + tool ``x`` and server ``a`` + tool ``_x`` would both be ``a___x``).
_SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?![_]|$)){0,31}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HTTP_TYPES = {"http", "streamable-http", "streamable_http", "streamableHttp"}


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """The server's key in ``mcpServers``; tool names become ``<name>__<tool>``."""
    timeout: Annotated[float, Field(gt=0, le=3600)] | None = None
    """Per-call timeout in seconds; None = the registry default."""


class StdioServerConfig(_Entry):
    """A server the broker starts as a child process and talks to over stdin/stdout."""

    transport: Literal["stdio"] = "stdio"
    command: Annotated[str, Field(min_length=1, max_length=4096)]
    args: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=256)] = []
    env: dict[str, str] = {}
    """Extra environment for the child (secrets allowed: never shown, not part of the digest)."""
    cwd: str | None = None

    @field_validator("command", "cwd")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        if value is not None and "\0" in value:
            raise ValueError("must not contain NUL")
        return value

    @field_validator("args")
    @classmethod
    def _args_no_nul(cls, value: list[str]) -> list[str]:
        if any("\0" in arg for arg in value):
            raise ValueError("arguments must not contain NUL")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 256:
            raise ValueError("at most 256 environment variables")
        for key, val in value.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"invalid environment variable name {key!r}")
            if "\0" in val or len(val) > 32768:
                raise ValueError(f"the value of {key} is too long or contains NUL")
        return value

    @property
    def source(self) -> str:
        """The command line, as bound into tool digests (env is left out: it may hold secrets)."""
        return shlex.join([self.command, *self.args])

    @property
    def shown_source(self) -> str:
        """The command line as listings show it: secret-named flags' values and token-shaped arguments
        masked (:func:`~relay_jupyter.core.redact.mask_argv`). ``source`` stays exact for digests."""
        return shlex.join(mask_argv([self.command, *self.args]))

    def __repr__(self) -> str:
        return f"StdioServerConfig(name={self.name!r}, source={self.shown_source!r}, env=<{len(self.env)} hidden>)"

    __str__ = __repr__


class HttpServerConfig(_Entry):
    """A server reached over Streamable HTTP (https, or http to loopback)."""

    transport: Literal["http"] = "http"
    url: str
    headers: dict[str, str] = {}
    """Sent with every request; tokens go here, never in the URL. Values never shown."""

    client_id: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$")] | None = None
    """A machine client of the server's authorization server (OAuth ``client_credentials``): relay gets its
    tokens with this id and the client secret from the relay secrets file, no person involved."""
    issuer: str | None = None
    """With ``client_id``, required: the authorization server the client secret may be sent to (its metadata's
    ``issuer``, exactly); a server that leads anywhere else gets nothing."""
    client_secret_entry: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$")] | None = None
    """The secrets file's entry holding the client secret (default ``mcp.<name>``)."""
    scope: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[\x21-\x7e]+( [\x21-\x7e]+)*$")] | None = None
    token_auth: Literal["client_secret_basic", "client_secret_post", "private_key_jwt"] | None = None
    """How the client authenticates at the token endpoint (default ``client_secret_basic``; ``private_key_jwt``:
    a JWT signed with the client's private key, RFC 7523, whose PEM is then the secrets file's entry)."""
    signing_algorithm: Literal["ES256", "ES384", "ES512", "RS256", "RS384", "RS512", "PS256", "EdDSA"] | None = None
    """With ``private_key_jwt``: the assertion's algorithm (default ``ES256``)."""

    @model_validator(mode="after")
    def _client_credentials(self) -> HttpServerConfig:
        extra = [k for k in ("issuer", "client_secret_entry", "scope", "token_auth", "signing_algorithm")
                 if getattr(self, k) is not None]
        if self.client_id is None:
            if extra:
                raise ValueError(f"{', '.join(extra)}: only with 'client_id' (the client_credentials grant)")
            return self
        if self.issuer is None:
            raise ValueError("'client_id' needs 'issuer': the authorization server the client secret may be sent to")
        if any(k.lower() == "authorization" for k in self.headers):
            raise ValueError("'client_id' and an Authorization header: use one way to authenticate")
        if self.signing_algorithm is not None and self.token_auth != "private_key_jwt":
            raise ValueError("'signing_algorithm' only goes with \"token_auth\": \"private_key_jwt\"")
        return self

    @property
    def secret_entry(self) -> str:
        """Where the client secret lives in the secrets file."""
        return self.client_secret_entry or f"mcp.{self.name}"

    @field_validator("issuer")
    @classmethod
    def _issuer_policy(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            check_endpoint(value)
        except ConfigRefusal as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("url")
    @classmethod
    def _policy(cls, value: str) -> str:
        try:
            return check_endpoint(value)
        except ConfigRefusal as exc:
            raise ValueError(exc.message) from None

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        try:
            return check_headers(value)
        except ConfigRefusal as exc:
            raise ValueError(exc.message) from None

    @property
    def source(self) -> str:
        """The URL, as bound into tool digests."""
        return self.url

    @property
    def shown_source(self) -> str:
        """The URL as listings show it (the endpoint policy already refuses credentials in it; a
        token-shaped query value is masked all the same)."""
        return mask_secret_text(self.url)

    def __repr__(self) -> str:
        return f"HttpServerConfig(name={self.name!r}, url={self.shown_source!r}, headers=<{len(self.headers)} hidden>)"

    __str__ = __repr__


ServerConfig = StdioServerConfig | HttpServerConfig


class McpConfig(BaseModel):
    """The parsed file: usable servers, plus one message per entry that could not be used."""

    model_config = ConfigDict(frozen=True)

    servers: dict[str, ServerConfig] = {}
    """Enabled, valid servers by name, in file order."""
    problems: dict[str, str] = {}
    """Server name -> why it is not used. Key ``""`` = a problem with the whole file."""
    disabled: tuple[str, ...] = ()
    """Servers switched off with ``"disabled": true``."""
    path: str | None = None


def default_config_path() -> Path:
    """``<jupyter config dir>/mcp.json`` (``JUPYTER_CONFIG_DIR`` moves it)."""
    return config_dir() / "mcp.json"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            # A JSON parser keeps the last duplicate silently; a second "git" entry
            # must not quietly replace the first one the user reviewed.
            raise ConfigRefusal(Code.CONFIG_INVALID, f"key {key!r} appears twice")
        out[key] = value
    return out


def _pydantic_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in err["loc"] if p != "name")
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _parse_entry(name: str, raw: Any) -> ServerConfig | None:
    """One entry -> a config, None when disabled; raises ConfigRefusal(CONFIG_INVALID) with the reason."""
    if not isinstance(raw, dict):
        raise ConfigRefusal(Code.CONFIG_INVALID, "an entry must be an object with 'command' or 'url'")
    entry = dict(raw)
    disabled = entry.pop("disabled", False)
    if not isinstance(disabled, bool):
        raise ConfigRefusal(Code.CONFIG_INVALID, "'disabled' must be true or false")
    kind = entry.pop("type", None)
    if kind is not None and not isinstance(kind, str):
        raise ConfigRefusal(Code.CONFIG_INVALID, "'type' must be a string")
    if kind == "sse":
        raise ConfigRefusal(
            Code.CONFIG_INVALID, "the legacy SSE transport is not supported; use Streamable HTTP ('type': 'http')"
        )
    if kind is not None and kind != "stdio" and kind not in _HTTP_TYPES:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"unknown transport type {kind!r} (use 'stdio' or 'http')")
    has_command, has_url = "command" in entry, "url" in entry
    if has_command and has_url:
        raise ConfigRefusal(Code.CONFIG_INVALID, "an entry has either 'command' (stdio) or 'url' (http), not both")
    if not has_command and not has_url:
        raise ConfigRefusal(Code.CONFIG_INVALID, "an entry needs 'command' (stdio) or 'url' (http)")
    if kind == "stdio" and not has_command or kind in _HTTP_TYPES and not has_url:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"'type': {kind!r} does not match the entry's keys")
    if "client_secret" in entry:  # never echoed; the secrets file is the one place for it
        raise ConfigRefusal(Code.CONFIG_INVALID, f"mcp.json holds no client secret: put it in the relay secrets file "
                                                 f"(c.RelayApp.secrets_file, mode 0600) under \"mcp.{name}\" "
                                                 "(or the entry named by 'client_secret_entry')")
    model: type[_Entry] = StdioServerConfig if has_command else HttpServerConfig
    try:
        config = model.model_validate({**entry, "name": name})
    except ValidationError as exc:
        raise ConfigRefusal(Code.CONFIG_INVALID, _pydantic_message(exc)) from None
    return None if disabled else config  # type: ignore[return-value]


def parse_config(text: str | bytes, *, path: str | None = None) -> McpConfig:
    """Parse the text of an ``mcp.json``. Never raises for bad content: problems are reported per entry."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except ConfigRefusal as exc:
        return McpConfig(problems={"": f"mcp.json is invalid: {exc.message}"}, path=path)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not valid JSON"
        return McpConfig(problems={"": f"mcp.json is not valid JSON: {reason}"}, path=path)
    if not isinstance(data, dict):
        return McpConfig(problems={"": "mcp.json must be a JSON object with an 'mcpServers' object"}, path=path)
    unknown = sorted(set(data) - {"mcpServers"})
    entries = data.get("mcpServers", {})
    if not isinstance(entries, dict):
        return McpConfig(problems={"": "'mcpServers' must be an object of named servers"}, path=path)
    servers: dict[str, ServerConfig] = {}
    problems: dict[str, str] = {}
    disabled: list[str] = []
    if unknown:
        # Other tools keep their own keys in this file (Claude Desktop "globalShortcut"...): note, don't fail.
        problems[""] = f"ignored top-level keys: {', '.join(unknown)}"
    folded: dict[str, str] = {}
    for index, (name, raw) in enumerate(entries.items()):
        if index >= MAX_SERVERS:
            problems[name] = f"more than {MAX_SERVERS} servers configured; this one is ignored"
            continue
        if not _SERVER_NAME.match(name):
            problems[name] = (
                "server names are 1-32 letters, digits, '-' or '_' (no '__', which separates server and tool, "
                "and no '_' at the end)"
            )
            continue
        if name.lower() in folded:
            problems[name] = f"server name clashes with {folded[name.lower()]!r} (names are compared ignoring case)"
            continue
        folded[name.lower()] = name
        try:
            config = _parse_entry(name, raw)
        except ConfigRefusal as exc:
            problems[name] = exc.message
            continue
        if config is None:
            disabled.append(name)
        else:
            servers[name] = config
    return McpConfig(servers=servers, problems=problems, disabled=tuple(disabled), path=path)


def load_config(path: str | os.PathLike[str] | None = None) -> McpConfig:
    """Read ``mcp.json`` from ``path`` or :func:`default_config_path`. A missing file is an empty config."""
    file = Path(path) if path is not None else default_config_path()
    shown = str(file)
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the broker's start.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return McpConfig(path=shown)
    except OSError as exc:
        return McpConfig(problems={"": f"cannot read {shown}: {exc.strerror}"}, path=shown)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return McpConfig(problems={"": f"{shown} is not a regular file"}, path=shown)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        return McpConfig(problems={"": f"{shown} is larger than {MAX_CONFIG_BYTES} bytes"}, path=shown)
    return parse_config(data, path=shown)
