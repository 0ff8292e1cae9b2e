"""Masking secrets before anything is logged, audited, emitted or shown.

Two layers, both fail-closed (a false positive masks too much; that is the cheap error):

* **keys** — a mapping value whose key names a secret (``password``, ``api_key``,
  ``authorization``, ``*_token`` ...) is replaced by :data:`MASK` whatever it is;
* **values** — every string (keys included) is scanned for well-known token shapes
  (``sk-ant-...``, ``sk-...``, ``ghp_...``, ``AKIA...``, Slack, Google, JWT), ``Bearer x``,
  ``name=value`` / ``name: value`` pairs whose name is key-ish, URL user-info passwords
  and PEM private-key blocks; each match is replaced by :data:`MASK` in place.

Masking happens *before* long strings are cut, so a cut can never leave half a secret
behind. Hand-written with :mod:`re` because ``core`` may import only the standard library
and pydantic; the patterns are kept in one table so they are easy to review and extend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MASK", "LINE_MASK", "redact", "looks_secret", "mask_secret_text", "mask_secret_lines", "secret_key"]

MASK = "<masked>"
LINE_MASK = "<line masked: looks like a secret>"

# Names that say "the value next to me is a secret". Matched anywhere inside a key
# (``my_api_key``, ``X-Auth-Token``), case-insensitively.
_KEY_WORDS = (
    r"password|passwd|passphrase|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key|private[_\-]?key"
    r"|credential|authorization|auth(?!or)|cookie|session[_\-]?id|signature|bearer"
)
_SECRET_KEY_RE = re.compile(rf"(?i)(?:{_KEY_WORDS})")
# Keys that contain a key word but hold counts, not secrets (``max_tokens``, ``input_tokens``).
_COUNT_KEY_RE = re.compile(r"(?i)(?:tokens|token_count|_count|_limit|tokens_per_\w+)$")

_VALUE_PATTERNS: tuple[re.Pattern[str], ...] = (
    # PEM private keys: the whole block, or from the header to the end if the footer is missing.
    re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY-----|.*)", re.S),
    re.compile(r"sk-ant-[A-Za-z0-9_\-]{6,}"),                 # Anthropic
    re.compile(r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}"),  # OpenAI and look-alikes
    re.compile(r"(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,})"),  # GitHub
    re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}"),                 # AWS access key id
    re.compile(r"xox[abposr]-[A-Za-z0-9\-]{10,}"),           # Slack
    re.compile(r"AIza[0-9A-Za-z_\-]{30,}"),                   # Google API key
    re.compile(r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
    re.compile(r"(?i)bearer\s+[A-Za-z0-9._~+/=\-]+"),          # Authorization: Bearer x
    # key-ish name followed by = or : and a value (quoted or bare): mask name and value together.
    re.compile(rf"(?i)[\w.\-]*(?:{_KEY_WORDS})[\w.\-]*[\"']?\s*[:=]\s*(?:\"[^\"]*\"|'[^']*'|(?:(?:bearer|basic)\s+)?[^\s,;&]+)"),
    re.compile(r"(?i)([a-z][a-z0-9+.\-]*://[^/\s:@]*):[^@\s/]+@"),  # URL user:password@
)


def secret_key(key: Any) -> bool:
    """True when a mapping key names a secret (``password``, ``apiKey``, ``X-Auth-Token`` ...)."""
    if not isinstance(key, str):
        return False
    return _SECRET_KEY_RE.search(key) is not None


def looks_secret(text: str) -> bool:
    """True when ``text`` contains anything shaped like a credential (see the module docstring)."""
    if not isinstance(text, str):
        raise TypeError("looks_secret() takes a str")
    return any(p.search(text) for p in _VALUE_PATTERNS)


def mask_secret_text(text: str) -> str:
    """``text`` with every secret-looking part replaced by :data:`MASK`."""
    if not isinstance(text, str):
        raise TypeError("mask_secret_text() takes a str")
    for pattern in _VALUE_PATTERNS:
        if pattern.groups:
            # keep the scheme and user of a URL, drop the password
            text = pattern.sub(lambda m: f"{m.group(1)}:{MASK}@", text)
        else:
            text = pattern.sub(MASK, text)
    return text


def mask_secret_lines(lines: list[str]) -> list[str]:
    """Each line that looks like a secret becomes :data:`LINE_MASK`; the others are kept."""
    return [LINE_MASK if looks_secret(line) else line for line in lines]


def _cut(text: str, max_str: int) -> str:
    if len(text) <= max_str:
        return text
    return f"{text[:max_str]}…[+{len(text) - max_str} chars]"


def redact(value: Any, *, max_str: int = 200, max_items: int = 100, max_depth: int = 12) -> Any:
    """A deep, JSON-friendly copy of ``value`` that is safe to log.

    Mapping values under secret keys become :data:`MASK`; secret-looking substrings become
    :data:`MASK`; strings longer than ``max_str`` are cut (after masking); containers keep at
    most ``max_items`` entries and ``max_depth`` levels; bytes become ``"<N bytes>"``; tuples
    and sets become lists; other objects are represented by their (masked, cut) ``repr``.
    Cycles cannot recurse forever: depth is bounded.

    Raises:
        ValueError: a limit is not a positive integer.
    """
    for name, limit in (("max_str", max_str), ("max_items", max_items), ("max_depth", max_depth)):
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"{name} must be a positive integer")
    return _redact(value, max_str, max_items, max_depth)


def _redact(value: Any, max_str: int, max_items: int, depth: int) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return _cut(mask_secret_text(value), max_str)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if depth <= 0:
        return "<nested too deep>"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= max_items:
                out["…"] = f"<{len(value) - max_items} more entries>"
                break
            key = _cut(mask_secret_text(k if isinstance(k, str) else repr(k)), max_str)
            if secret_key(k) and not (isinstance(v, int) and _COUNT_KEY_RE.search(str(k))):
                out[key] = MASK if v not in (None, "") else v
            else:
                out[key] = _redact(v, max_str, max_items, depth - 1)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        body = [_redact(v, max_str, max_items, depth - 1) for v in items[:max_items]]
        if len(items) > max_items:
            body.append(f"<{len(items) - max_items} more items>")
        return body
    return _cut(mask_secret_text(repr(value)), max_str)
