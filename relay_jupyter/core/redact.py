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
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

__all__ = ["LINE_MASK", "MASK", "looks_secret", "mask_argv", "mask_secret_lines", "mask_secret_text", "redact",
           "secret_key"]

MASK = "<masked>"
LINE_MASK = "<line masked: looks like a secret>"

# Names that say "the value next to me is a secret". Matched anywhere inside a key
# (``my_api_key``, ``X-Auth-Token``), case-insensitively.
_KEY_WORDS = (
    r"password|passwd|passphrase|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key|private[_\-]?key"
    r"|credential|authorization|auth(?!or)|cookie|session[_\-]?id|signature|bearer"
)
# Matched against lowercased keys (case-insensitive alternations are slow in ``re``).
_SECRET_KEY_RE = re.compile(rf"(?:{_KEY_WORDS})")
# Keys that contain a key word but hold counts, not secrets (``max_tokens``, ``input_tokens``).
_COUNT_KEY_RE = re.compile(r"(?:tokens|token_count|_count|_limit|tokens_per_\w+)$")

def _keep1(suffix: str) -> Callable[[re.Match[str], str], str]:
    """Replacement keeping group 1 (taken from the original text), then ``suffix``."""
    return lambda m, text: text[m.start(1):m.end(1)] + suffix


def _mask(m: re.Match[str], text: str) -> str:
    return MASK


class _Rule:
    """One secret shape. ``lower`` rules are written in lowercase and matched against ``text.lower()``:
    Python's ``re`` cannot scan fast for case-insensitive alternations (about 100× slower here),
    and lowering keeps positions whenever the length does not change (checked; else ``re.I``)."""

    __slots__ = ("folded", "lower", "needles", "pattern", "repl")

    def __init__(self, pattern: str, needles: tuple[str, ...], *, lower: bool = False, flags: int = 0,
                 repl: Callable[[re.Match[str], str], str] = _mask) -> None:
        self.pattern = re.compile(pattern, flags)
        self.folded = re.compile(pattern, flags | re.IGNORECASE) if lower else self.pattern
        self.needles, self.repl, self.lower = needles, repl, lower

    def sub(self, text: str, low: str) -> str:
        if self.lower and len(low) == len(text):
            matches = list(self.pattern.finditer(low))
        else:
            matches = list(self.folded.finditer(text))
        if not matches:
            return text
        out, pos = [], 0
        for m in matches:
            out.append(text[pos:m.start()])
            out.append(self.repl(m, text))
            pos = m.end()
        out.append(text[pos:])
        return "".join(out)

    def search(self, text: str, low: str) -> bool:
        if self.lower and len(low) == len(text):
            return self.pattern.search(low) is not None
        return self.folded.search(text) is not None


_KW_NEEDLES = ("pass", "pwd", "secret", "token", "key", "credential", "auth", "cookie", "session", "signature",
               "bearer")
_RULES: tuple[_Rule, ...] = (
    # PEM private keys: the whole block, or from the header to the end if the footer is missing.
    _Rule(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY-----|.*)", ("private key",),
          flags=re.DOTALL),
    _Rule(r"sk-ant-[A-Za-z0-9_\-]{6,}", ("sk-",)),                           # Anthropic
    _Rule(r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}", ("sk-",)),   # OpenAI and look-alikes
    _Rule(r"gh[pousr]_[A-Za-z0-9]{16,}", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),  # GitHub tokens
    _Rule(r"github_pat_[A-Za-z0-9_]{16,}", ("github_pat_",)),
    _Rule(r"(?:AKIA|ASIA)[0-9A-Z]{16}", ("akia", "asia")),                  # AWS access key id
    _Rule(r"xox[abposr]-[A-Za-z0-9\-]{10,}", ("xox",)),                     # Slack
    _Rule(r"AIza[0-9A-Za-z_\-]{30,}", ("aiza",)),                           # Google API key
    _Rule(r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", ("eyj",)),  # JWT
    _Rule(r"bearer\s+[a-z0-9._~+/=\-]+", ("bearer",), lower=True),          # Authorization: Bearer x
    # A key-ish name, then = or :, then a value (quoted or bare, "Basic x" included): keep the name.
    # Anchored on the key word (no leading [\w]* scan), which keeps it linear.
    _Rule(rf"((?:{_KEY_WORDS})[\w.\-]*[\"']?\s*[:=]\s*)(?:\"[^\"]*\"|'[^']*'|(?:(?:bearer|basic)\s+)?[^\s,;&]+)",
          _KW_NEEDLES, lower=True, repl=_keep1(MASK)),
    _Rule(r"([a-z][a-z0-9+.\-]*://[^/\s:@]*):[^@\s/]+@", ("://",), lower=True, repl=_keep1(f":{MASK}@")),
)
_VALUE_PATTERNS = tuple(r.folded for r in _RULES)


def _triggered(low: str) -> bool:
    # Every rule needs one of these substrings (the key=value rule needs ':' or '='). Plain ``in``
    # tests run in C; most strings are clean and stop here.
    return (":" in low or "=" in low or "sk-" in low or "gh" in low or "akia" in low or "asia" in low
            or "xox" in low or "aiza" in low or "eyj" in low or "bearer" in low or "private key" in low)


def _applies(rule: _Rule, low: str) -> bool:
    if rule.repl is not _mask and rule.needles is _KW_NEEDLES and ":" not in low and "=" not in low:
        return False
    return any(n in low for n in rule.needles)


def secret_key(key: Any) -> bool:
    """True when a mapping key names a secret (``password``, ``apiKey``, ``X-Auth-Token`` ...)."""
    if not isinstance(key, str):
        return False
    return _key_flags(key)[0]


def _key_flags(key: str) -> tuple[bool, bool]:
    """(names a secret, names a count), on the lowercased key. No real argument name is longer than
    1 KiB: a longer key is hostile, and its value is treated as a secret (fail closed)."""
    if len(key) > 1024:
        return True, False
    low = key.lower()
    return _SECRET_KEY_RE.search(low) is not None, _COUNT_KEY_RE.search(low) is not None


@lru_cache(maxsize=4096)
def _key_info(key: str) -> tuple[str, bool, bool]:
    # Keys repeat across calls (a tool's argument names), so their verdicts are cached.
    return (mask_secret_text(key), *_key_flags(key))


def looks_secret(text: str) -> bool:
    """True when ``text`` contains anything shaped like a credential (see the module docstring)."""
    if not isinstance(text, str):
        raise TypeError("looks_secret() takes a str")
    low = text.lower()
    if not _triggered(low):
        return False
    return any(_applies(rule, low) and rule.search(text, low) for rule in _RULES)


def mask_secret_text(text: str) -> str:
    """``text`` with every secret-looking part replaced by :data:`MASK`."""
    if not isinstance(text, str):
        raise TypeError("mask_secret_text() takes a str")
    low = text.lower()
    if not _triggered(low):
        return text
    for rule in _RULES:
        if _applies(rule, low):
            masked = rule.sub(text, low)
            if masked is not text:
                text, low = masked, masked.lower()
    return text


def mask_argv(argv: list[str]) -> list[str]:
    """A command line as it may be shown: the value of every secret-named flag (``--token X``,
    ``--api-key=X``, ``-e GITHUB_TOKEN=X``, ``API_KEY=X``) and every secret-shaped argument is
    :data:`MASK`. MCP servers take tokens on their command line (``env`` values are never shown, and a
    listing must not print what ``env`` would have hidden)."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if not isinstance(arg, str):
            raise TypeError("mask_argv() takes a list of str")
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        name, eq, value = arg.partition("=")
        if eq and value and secret_key(name.lstrip("-")) and not _key_flags(name)[1]:
            out.append(f"{name}={MASK}")
            continue
        if arg.startswith("-") and not eq and secret_key(arg.lstrip("-")) and not _key_flags(arg)[1]:
            out.append(arg)
            mask_next = True
            continue
        out.append(mask_secret_text(arg))
    return out


def mask_secret_lines(lines: list[str]) -> list[str]:
    """Each line that looks like a secret becomes :data:`LINE_MASK`; the others are kept."""
    return [LINE_MASK if looks_secret(line) else line for line in lines]


# Masking looks at most this many characters past the cut. Every secret that *starts* before the
# cut then has far more room than the longest minimum length of a rule (40), so it is recognised
# and masked; what lies beyond the window is dropped anyway. This bounds the cost of redacting a
# huge string (a model can send megabytes) to the size of the window.
_WINDOW = 512


def _masked_cut(text: str, max_str: int) -> str:
    """Mask, then cut to ``max_str`` — masking only a window, so the cost is bounded."""
    total = len(text)
    if total > max_str + _WINDOW:
        masked = mask_secret_text(text[: max_str + _WINDOW])
        return f"{masked[:max_str]}…[+{total - max_str} chars]"
    return _cut(mask_secret_text(text), max_str)


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
    # exact type checks: bool is not a limit, and this runs on the gate's hot path
    if type(max_str) is not int or type(max_items) is not int or type(max_depth) is not int \
            or max_str < 1 or max_items < 1 or max_depth < 1:
        raise ValueError("max_str, max_items and max_depth must be positive integers")
    return _redact(value, max_str, max_items, max_depth)


_SCALARS = frozenset({type(None), bool, int, float})


def redact_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """``redact(arguments)`` with the default limits, for tool-call arguments (a dict, as
    ``ToolRequest`` guarantees). The gate's hot path: skips re-checking the limits."""
    if type(arguments) is dict:
        return _redact_mapping(arguments, 200, 100, 12)
    return redact(arguments)


def _redact(value: Any, max_str: int, max_items: int, depth: int) -> Any:
    kind = type(value)
    # exact-type fast paths first (ABC isinstance checks cost microseconds)
    if kind is str:
        return _masked_cut(value, max_str)
    if kind in _SCALARS:
        return value
    if kind is dict and depth > 0:
        return _redact_mapping(value, max_str, max_items, depth)
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return _masked_cut(str(value), max_str)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if depth <= 0:
        return "<nested too deep>"
    if isinstance(value, Mapping):
        return _redact_mapping(value, max_str, max_items, depth)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        body = [_redact(v, max_str, max_items, depth - 1) for v in items[:max_items]]
        if len(items) > max_items:
            body.append(f"<{len(items) - max_items} more items>")
        return body
    return _masked_cut(_safe_repr(value), max_str)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # noqa: BLE001 - a hostile __repr__ must not break auditing
        return f"<{type(value).__name__} (repr failed: {type(exc).__name__})>"


def _redact_mapping(value: Mapping[Any, Any], max_str: int, max_items: int, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    items = value.items()
    extra = len(value) - max_items
    for k, v in (items if extra <= 0 else list(items)[:max_items]):
        if type(k) is str and len(k) <= 256:
            key, is_secret, is_count = _key_info(k)
            if len(key) > max_str:
                key = _cut(key, max_str)
        elif isinstance(k, str):
            key = _masked_cut(k, max_str)
            is_secret, is_count = _key_flags(k)
        else:
            key, is_secret, is_count = _masked_cut(_safe_repr(k), max_str), False, False
        if is_secret and not (is_count and isinstance(v, int)):
            # identity checks only: ``v == ...`` on an arbitrary object (an array) may raise
            out[key] = v if v is None or (type(v) is str and not v) else MASK
        else:
            tv = type(v)
            # scalars inline: most argument values are short strings and numbers
            if tv is str and len(v) <= max_str and not _triggered(v.lower()) or tv in _SCALARS:
                out[key] = v
            else:
                out[key] = _redact(v, max_str, max_items, depth - 1)
    if extra > 0:
        out["…"] = f"<{extra} more entries>"
    return out
