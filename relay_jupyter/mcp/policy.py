"""Endpoint policy for MCP servers reached over HTTP (seed 002, endpoint-policy).

- The scheme is ``https`` (any host) or ``http`` to a loopback host only: ``localhost``,
  an IPv4 address in 127.0.0.0/8, or ``[::1]``. Anything else (``http://evil.com``,
  ``ftp://``, ``http://0.0.0.0``, ``http://127.0.0.1.evil.com``) is refused.
- No credentials in the URL: userinfo (``https://user:pw@host``) and token-ish query
  parameters (``?token=``, ``?api_key=`` ...) are refused. Tokens go in headers.
- Headers are bounded; a header cannot replace a header the transport manages
  (``Mcp-Session-Id``, ``Content-Type`` ...); header *values* are never logged or
  shown: :func:`describe_headers` prints names only.

Refusals are :class:`~relay_jupyter.core.errors.ConfigRefusal` with code
``ENDPOINT_REFUSED`` and a one-line message a user can act on.

The same policy covers every outbound URL the broker is configured with: model base URLs
(``anthropic_base_url``, ``openai_base_url``, the SDK's ``ANTHROPIC_BASE_URL``) go through
:func:`check_model_endpoint`, whose messages name the setting. Plain ``http`` to a host that is not
loopback is allowed only when the exact ``http://host:port`` is listed in
``c.RelayApp.allow_insecure_endpoints`` (:func:`parse_insecure_endpoints`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlsplit

from ..core.errors import Code, ConfigRefusal
from ..core.netaddr import is_loopback_host

__all__ = [
    "MAX_HEADERS",
    "MAX_HEADER_VALUE",
    "MAX_URL_LENGTH",
    "check_endpoint",
    "check_headers",
    "check_model_endpoint",
    "parse_insecure_endpoints",
    "describe_headers",
    "is_loopback_host",
]

MAX_URL_LENGTH = 2048
MAX_HEADERS = 32
MAX_HEADER_VALUE = 8192

# Query parameter names that carry credentials. Compared after lower-casing and
# dropping '-' and '_', so "api-key", "API_KEY" and "apikey" are one name.
_SECRET_PARAMS = frozenset(
    {
        "token", "accesstoken", "refreshtoken", "idtoken", "authtoken", "bearer",
        "apikey", "key", "secret", "clientsecret", "password", "passwd", "pwd",
        "auth", "authorization", "credential", "credentials", "session", "sessionid",
        "sig", "signature", "xamzsignature", "xamzcredential", "xamzsecuritytoken", "code",
    }
)
# Substrings that make any parameter name token-ish ("github_token", "my_api_key").
_SECRET_PARAM_PARTS = ("token", "secret", "password", "apikey", "credential", "signature")

# Headers the MCP transport sets itself; a config header must not replace them.
_MANAGED_HEADERS = frozenset(
    {
        "host", "content-length", "content-type", "accept", "transfer-encoding", "connection",
        "mcp-session-id", "mcp-protocol-version", "last-event-id", "upgrade", "te", "trailer",
    }
)
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")


def _refuse(message: str) -> ConfigRefusal:
    return ConfigRefusal(Code.ENDPOINT_REFUSED, message)


def _param_is_secret(name: str) -> bool:
    folded = name.lower().replace("-", "").replace("_", "")
    return folded in _SECRET_PARAMS or any(part in folded for part in _SECRET_PARAM_PARTS)


def check_endpoint(url: str, *, allow_insecure: Iterable[tuple[str, int]] = ()) -> str:
    """Return ``url`` unchanged when the policy allows it; else raise ``ConfigRefusal(ENDPOINT_REFUSED)``.

    ``allow_insecure`` holds ``(host, port)`` pairs (from :func:`parse_insecure_endpoints`) that may
    be reached over plain http although they are not loopback. The message never repeats a
    credential found in the URL.
    """
    return _check(url, "the MCP server URL", "MCP server URLs", "put the token in a header instead",
                  frozenset(allow_insecure), None)


def check_model_endpoint(url: str, setting: str, *, allow_insecure: Iterable[tuple[str, int]] = ()) -> str:
    """:func:`check_endpoint` for a model server's base URL; every message starts with ``setting``
    (e.g. ``c.RelayApp.openai_base_url``) so the user knows which line of the config to fix."""
    try:
        return _check(url, "the URL", "model server URLs",
                      "put the key in the secrets file or the server config instead",
                      frozenset(allow_insecure), "c.RelayApp.allow_insecure_endpoints")
    except ConfigRefusal as exc:
        raise _refuse(f"{setting}: {exc.message}") from None


def parse_insecure_endpoints(entries: Iterable[str], setting: str = "c.RelayApp.allow_insecure_endpoints"
                             ) -> frozenset[tuple[str, int]]:
    """``["http://host:port", ...]`` -> ``{(host, port)}``. Each entry is exactly a scheme ``http``, a
    host and an explicit port (no path, query or credentials); anything else is refused."""
    out: set[tuple[str, int]] = set()
    for entry in entries:
        shown = repr(str(entry)[:80]) if "@" not in str(entry) else "(an entry with credentials)"
        problem = f"{setting}: entries are \"http://host:port\"; got {shown}"
        if not isinstance(entry, str) or any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in entry):
            raise _refuse(problem)
        try:
            parts = urlsplit(entry)
            port = parts.port
        except ValueError:
            raise _refuse(problem) from None
        if (parts.scheme.lower() != "http" or "@" in parts.netloc or not parts.hostname or port is None
                or parts.path not in ("", "/") or parts.query or parts.fragment):
            raise _refuse(problem)
        out.add((parts.hostname.lower(), port))
    return frozenset(out)


def _check(url: str, what: str, plural: str, instead: str, allow_insecure: frozenset[tuple[str, int]],
           allow_setting: str | None) -> str:
    if not isinstance(url, str) or not url:
        raise _refuse(f"{what} is empty")
    if len(url) > MAX_URL_LENGTH:
        raise _refuse(f"{what} is longer than {MAX_URL_LENGTH} characters")
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise _refuse(f"{what} contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a bad port
    except ValueError:
        raise _refuse(f"{what} is not a valid URL") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _refuse(f"{plural} must use https (or http to localhost); got scheme {scheme or '(none)'!r}")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise _refuse(f"credentials in {what} are refused; {instead}")
    host = parts.hostname or ""
    if not host:
        raise _refuse(f"{what} has no host")
    if scheme == "http" and not is_loopback_host(host) and (host, port or 80) not in allow_insecure:
        where = f"{host}:{port}" if port else host
        also = (f', or list "http://{host}:{port or 80}" in {allow_setting} to accept plain http to it'
                if allow_setting else "")
        raise _refuse("plain http is allowed only to loopback (localhost, 127.0.0.1, ::1); "
                      f"use https for {where}{also}")
    for name, _value in parse_qsl(parts.query, keep_blank_values=True):
        if _param_is_secret(name):
            raise _refuse(f"{what} carries a credential in its query (parameter {name!r}); {instead}")
    return url


def check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Validate configured HTTP headers and return a plain copy. Values are never part of a message."""
    if len(headers) > MAX_HEADERS:
        raise _refuse(f"at most {MAX_HEADERS} headers may be configured for an MCP server")
    seen: set[str] = set()
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise _refuse(f"invalid HTTP header name {name!r}")
        lowered = name.lower()
        if lowered in _MANAGED_HEADERS:
            raise _refuse(f"header {name!r} is managed by the MCP transport and cannot be configured")
        if lowered in seen:
            raise _refuse(f"header {name!r} is configured twice")
        seen.add(lowered)
        if not isinstance(value, str):
            raise _refuse(f"the value of header {name!r} must be a string")
        if len(value) > MAX_HEADER_VALUE:
            raise _refuse(f"the value of header {name!r} is longer than {MAX_HEADER_VALUE} characters")
        if any(ch in value for ch in "\r\n\0"):
            raise _refuse(f"the value of header {name!r} contains a line break or NUL")
        out[name] = value
    return out


def describe_headers(headers: Mapping[str, str]) -> str:
    """Header names only, for messages and logs: ``Authorization: <hidden>, X-Team: <hidden>``."""
    return ", ".join(f"{name}: <hidden>" for name in headers) or "(none)"
