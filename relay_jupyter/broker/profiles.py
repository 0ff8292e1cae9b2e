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

__all__ = ["PROFILE_HEADER", "Profile", "Wire", "parse_profiles", "profile_rows"]

#: The request header that selects a profile.
PROFILE_HEADER = "x-relay-profile"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
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
