"""Profiles (issue 16 item 6): several named upstreams for the model endpoints.

    c.RelayApp.profiles = {
        "team": {"anthropic_base_url": "https://llm-gateway.example.com"},   # key: secrets file "team.anthropic"
        "local": {"openai_base_url": "http://127.0.0.1:8080/v1"},            # a local server: no key needed
    }

A profile names an Anthropic-compatible and/or an OpenAI-compatible base URL. Its keys come **only from the
0600 secrets file** (entries ``<profile>.anthropic`` / ``<profile>.openai``, or the entry names given as
``anthropic_key`` / ``openai_key``): never a key value in the configuration (refused at start), never the
server's environment. Every profile URL goes through the one endpoint policy of model URLs
(``mcp/policy.check_model_endpoint``: https, or http to loopback, or ``allow_insecure_endpoints``), checked when
the broker starts.

A request picks a profile with the ``X-Relay-Profile: <name>`` header (``relay.anthropic(profile=...)`` sends
it); the origin's grant must list the profile (``Grant.profiles``); without the header the request goes to the
broker's own upstream (``anthropic_base_url`` / ``openai_base_url``), as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..core.errors import Code, ConfigRefusal
from ..protocol.models_runs import PROFILE_NAME_PATTERN

__all__ = ["PROFILE_HEADER", "Profile", "Wire", "parse_profiles", "profile_rows", "run_backend"]

#: The request header that selects a profile.
PROFILE_HEADER = "x-relay-profile"
_NAME = re.compile(PROFILE_NAME_PATTERN)  # the same pattern as run.start's ``profile``
Wire = Literal["anthropic", "openai"]


class Profile(BaseModel):
    """One named upstream. ``*_key``: the secrets-file entry holding that wire's key (default
    ``<profile>.<wire>``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    anthropic_base_url: str | None = None
    openai_base_url: str | None = None
    anthropic_key: str | None = None
    openai_key: str | None = None
    description: str = ""

    def url(self, wire: Wire) -> str | None:
        return self.anthropic_base_url if wire == "anthropic" else self.openai_base_url

    def key_entry(self, name: str, wire: Wire) -> str:
        entry = self.anthropic_key if wire == "anthropic" else self.openai_key
        return entry or f"{name}.{wire}"


def parse_profiles(raw: Mapping[str, Any], insecure: Iterable[tuple[str, int]] = ()) -> dict[str, Profile]:
    """``c.RelayApp.profiles`` checked: names, fields, every URL under the endpoint policy.

    Raises:
        ConfigRefusal: CONFIG_INVALID (a bad name or field, a key value in the configuration) or
            ENDPOINT_REFUSED (a URL outside the policy), in one line naming the profile.
    """
    from ..mcp.policy import check_model_endpoint

    out: dict[str, Profile] = {}
    allowed = tuple(insecure)
    for name, spec in raw.items():
        where = f"c.RelayApp.profiles[{str(name)[:40]!r}]"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{where}: a profile name is 1-32 of [A-Za-z0-9_-]")
        if not isinstance(spec, Mapping):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{where} must be a dict of settings")
        if any("api_key" in str(k) for k in spec):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{where}: keys never go in the configuration: put the key in "
                                f"the secrets file as {name}.anthropic / {name}.openai (mode 0600)")
        try:
            profile = Profile.model_validate(dict(spec))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first.get("loc", ())) or "?"
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{where}.{field}: {first.get('msg', 'invalid')}") from None
        if profile.anthropic_base_url is None and profile.openai_base_url is None:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"{where}: name anthropic_base_url or openai_base_url")
        for wire in ("anthropic", "openai"):
            url = profile.url(wire)  # type: ignore[arg-type]
            if url is not None:
                check_model_endpoint(url, f"{where}.{wire}_base_url", allow_insecure=allowed)
        out[name] = profile
    return out


def profile_rows(config: Any) -> list[dict[str, Any]]:
    """One row per configured profile for ``jupyter relay profiles list``: name, URLs, the secrets-file entry
    of each key and whether it is there — never a key.

    Raises:
        ConfigRefusal: the profiles are invalid, or the secrets file is unsafe.
    """
    from ..backends.keys import KeySource
    from ..mcp.policy import parse_insecure_endpoints

    profiles = parse_profiles(config.profiles, parse_insecure_endpoints(config.allow_insecure_endpoints))
    keys = KeySource({}, config.secrets_file, env={})
    rows = []
    for name, profile in sorted(profiles.items()):
        row: dict[str, Any] = {"profile": name, "description": profile.description}
        for wire in ("anthropic", "openai"):
            url = profile.url(wire)  # type: ignore[arg-type]
            entry = profile.key_entry(name, wire)  # type: ignore[arg-type]
            row[wire] = None if url is None else {
                "base_url": url, "key_entry": entry,
                "key": "present" if config.secrets_file and keys.get(entry) is not None else "missing"}
        rows.append(row)
    return rows


def run_backend(broker: Any, origin: str, name: str, backend: str | None) -> tuple[str, Any]:
    """``%%agent --profile NAME`` (``run.start``'s ``profile``): the backend name and the backend of the run,
    built over the profile's upstream (its URL, its key from the secrets file only) by the backend registry,
    once per (profile, backend) in the broker's life. ``backend``: the run's ``backend`` if it named one
    (else the server's default when the profile has that wire, else the profile's Anthropic, else OpenAI URL).

    Raises:
        RoutingRefusal: NOT_FOUND, no such profile (the line names ``jupyter relay profiles list``).
        GateRefusal: UNAUTHORIZED (no grant) or SCOPE_EXCEEDED (the grant does not list it): audited as tool
            ``profile:<name>``.
        ConfigRefusal: CONFIG_INVALID (the profile has no URL for the backend), NO_CREDENTIALS (no key).
    """
    import time

    from ..backends.keys import KeySource
    from ..backends.registry import build_upstream_backend
    from ..core.errors import GateRefusal, RoutingRefusal
    from ..core.types import AuditRecord
    from ..mcp.policy import parse_insecure_endpoints

    config = broker.config
    profiles = parse_profiles(getattr(config, "profiles", {}) or {},
                              parse_insecure_endpoints(config.allow_insecure_endpoints))
    profile = profiles.get(name)
    if profile is None:
        raise RoutingRefusal(Code.NOT_FOUND, f"no profile named {name!r} is configured on this server "
                             "(see `jupyter relay profiles list`)")
    grant = broker.gate.grants.get(origin)
    allowed = getattr(grant, "profiles", frozenset())
    if grant is None or ("*" not in allowed and name not in allowed):
        code = Code.UNAUTHORIZED if grant is None else Code.SCOPE_EXCEEDED
        broker.audit.append(AuditRecord(ts=time.time(), origin=origin, tool=f"profile:{name}", decision="deny",
                                        code=code.value, arguments={"purpose": "agent"}))
        raise GateRefusal(code, "this notebook has no grant: connect it to relay first" if grant is None
                          else f"the profile {name!r} is not in this notebook's grant")
    if backend is None:
        default = config.default_backend
        backend = default if default in ("anthropic", "openai") and profile.url(default) else \
            ("anthropic" if profile.anthropic_base_url else "openai")
    if backend not in ("anthropic", "openai") or profile.url(backend) is None:  # type: ignore[arg-type]
        raise ConfigRefusal(Code.CONFIG_INVALID, f"the profile {name!r} has no {backend}_base_url")
    cache = broker.runs.profile_backends
    built = cache.get((name, backend))
    if built is None:
        entry = profile.key_entry(name, backend)  # type: ignore[arg-type]
        key = KeySource({}, config.secrets_file, env={}).get(entry)  # the secrets file only
        if key is None and backend == "anthropic":
            raise ConfigRefusal(Code.NO_CREDENTIALS, f"the profile {name!r} has no key: put it in the relay "
                                f"secrets file (mode 0600) as {entry!r}")
        built = cache[(name, backend)] = build_upstream_backend(
            backend, config, profile.url(backend), key.reveal() if key is not None else None)  # type: ignore[arg-type]
    return backend, built
