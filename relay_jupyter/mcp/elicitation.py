"""Elicitation: an MCP server asking the user for input during a tool call (``elicitation/create``).

Everything in a request is untrusted (the server wrote it). This module turns a request into a form
the notebook can show, or refuses it, and checks an answer against that form; the broker routes the
form to the kernel that started the run (``broker/elicitations.py``) and the user answers there.

- **Form mode** (protocol 2025-06-18 and later: :func:`~.versions.has` ``elicitation_form``) and **URL
  mode** (2025-11-25 and later, ``elicitation_url``: "open this page", for what must not pass through the
  client — a sign-in, a payment): :func:`parse_url_request` checks the link (https, or http to loopback; no
  credentials in it; bounded) and the card shows it with its host, opened **only by the person's click**
  (relay never opens it). Accept means "I opened it"; nothing typed there reaches relay.
- **Bounded**: the requested schema must be a flat object (the MCP "restricted subset") of at most
  :data:`MAX_FIELDS` string / number / integer / boolean / enum / multi-select fields, at most
  :data:`MAX_SCHEMA_BYTES` of canonical JSON; the message is cut at :data:`MAX_MESSAGE_CHARS`; titles
  and descriptions at 200 / 500 characters; at most :data:`MAX_PER_CALL` elicitations per tool call.
  Anything else is declined without asking (:class:`Refused`, with the reason).
- **No secrets through a form**: a field named or described like a credential (password, token,
  secret, API key, PIN, card number…) or with ``format: password`` / ``writeOnly`` makes the whole
  request declined without showing it. Why: MCP (2025-06-18 on) says servers MUST NOT ask for
  sensitive information in form mode; an answer typed into a cell lands in the notebook's outputs,
  the event log and the server's hands, and a server that wants a credential should get it from
  ``mcp.json`` (``env`` / ``headers``), which the broker holds and never shows. The user sees one line
  saying what was declined and why.
- **Never auto-accepted**: there is no policy that accepts an elicitation; headless kernels and
  timeouts decline.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..core.types import canonical_json

__all__ = [
    "CALL_CONTEXT",
    "MAX_FIELDS",
    "MAX_MESSAGE_CHARS",
    "MAX_PER_CALL",
    "MAX_SCHEMA_BYTES",
    "ElicitationAnswer",
    "ElicitationAsk",
    "ElicitationHandler",
    "FormField",
    "Refused",
    "call_context",
    "check_answer",
    "defaults_of",
    "parse_form",
    "parse_url_request",
    "secret_fields",
]

MAX_SCHEMA_BYTES = 16 * 1024
MAX_FIELDS = 20
MAX_MESSAGE_CHARS = 2000
MAX_PER_CALL = 3
MAX_OPTIONS = 50
MAX_ANSWER_CHARS = 4096
_TITLE_CHARS = 200
_DESCRIPTION_CHARS = 500
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_STRING_FORMATS = ("email", "uri", "date", "date-time")
# Credential-like words in a field's name, title or description (matched case-insensitively on
# words split at _ - . and camelCase). Deliberately broad: a false positive declines a form the
# user could still answer by configuring the server; a false negative hands a secret to a server.
_SECRETISH = re.compile(
    r"(?i)(passw|passphrase|passcode|secret|token|api[\s_-]?key|apikey|credential|private[\s_-]?key|"
    r"\bpin\b|\botp\b|one[\s-]time|2fa|mfa|\bssn\b|social security|credit[\s_-]?card|card[\s_-]?number|"
    r"\bcvv\b|\bcvc\b|\biban\b|\bauth(?:entication|orization|code)?\b|bearer|cookie|session[\s_-]?id|seed phrase|mnemonic)"
)

CALL_CONTEXT: contextvars.ContextVar[Any] = contextvars.ContextVar("relay_mcp_call_context", default=None)
"""Who the running tool call is for (a ``ToolContext``-like object with ``origin``, ``originator``,
``run_id``), set around an MCP call by its caller (:func:`call_context`). An elicitation that arrives
while that call is the connection's only one in flight is routed to that run; otherwise it is declined."""


@contextlib.contextmanager
def call_context(ctx: Any) -> Iterator[None]:
    """Run the body with :data:`CALL_CONTEXT` set to ``ctx``."""
    token = CALL_CONTEXT.set(ctx)
    try:
        yield
    finally:
        CALL_CONTEXT.reset(token)


class Refused(Exception):
    """An elicitation relay declines without asking the user; ``reason`` is one line for the user."""

    def __init__(self, reason: str, *, kind: str = "schema") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        """``schema`` | ``secret`` | ``mode`` | ``version`` | ``limit`` | ``context``."""


@dataclass(frozen=True)
class FormField:
    """One field of an elicitation form, as relay shows and checks it."""

    name: str
    kind: str
    """``string`` | ``number`` | ``integer`` | ``boolean`` | ``enum`` | ``multi``."""
    title: str = ""
    description: str = ""
    required: bool = False
    default: Any = None
    options: tuple[tuple[str, str], ...] = ()
    """``(value, label)`` of an ``enum`` / ``multi`` field."""
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    format: str | None = None
    min_items: int | None = None
    max_items: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v not in (None, "", ())}
        out["required"] = self.required
        if self.options:
            out["options"] = [list(o) for o in self.options]
        return out


@dataclass(frozen=True)
class ElicitationAsk:
    """A checked elicitation request, ready to be shown: what the router gets."""

    server: str
    message: str
    fields: tuple[FormField, ...]
    context: Any
    """The call's :data:`CALL_CONTEXT` (origin, originator, run_id …)."""
    tool: str = ""
    """``server__tool`` of the call during which the server asked."""
    protocol_version: str | None = None
    refused: str | None = None
    """Set when relay declines the request without asking (a credential field, a schema over the
    bounds …): the handler only records it and tells the user in one line; the answer is decline."""
    refused_kind: str | None = None
    url: str | None = None
    """URL mode: the checked link the server asks the user to open (``fields`` is empty)."""
    elicitation_id: str | None = None

    @property
    def mode(self) -> str:
        return "url" if self.url is not None else "form"


@dataclass(frozen=True)
class ElicitationAnswer:
    action: str
    """``accept`` | ``decline`` | ``cancel``."""
    content: dict[str, Any] | None = None
    answered_by: str = ""
    reason: str = ""


ElicitationHandler = Callable[[ElicitationAsk], Awaitable[ElicitationAnswer]]


def _cut(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else ""
    text = "".join(ch if ch.isprintable() or ch in "\n\t" else " " for ch in text)
    return text if len(text) <= limit else text[:limit] + "…"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10**6 else None


def _options(prop: dict[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """``enum`` (+ legacy ``enumNames``) or ``oneOf``/``anyOf`` of ``{const, title}``; None if not an enum."""
    if isinstance(prop.get("enum"), list):
        values = prop["enum"]
        names = prop.get("enumNames") if isinstance(prop.get("enumNames"), list) else values
        if len(names) != len(values):
            names = values
        pairs = list(zip(values, names))
    else:
        choices = prop.get("oneOf") if isinstance(prop.get("oneOf"), list) else prop.get("anyOf")
        if not isinstance(choices, list):
            return None
        pairs = [(c.get("const"), c.get("title", c.get("const"))) for c in choices if isinstance(c, dict)]
        if len(pairs) != len(choices):
            raise Refused("an enum field lists something other than {const, title} choices")
    if not pairs or len(pairs) > MAX_OPTIONS:
        raise Refused(f"an enum field has {len(pairs)} choices (1 to {MAX_OPTIONS})")
    out = []
    for value, label in pairs:
        if not isinstance(value, str) or len(value) > _TITLE_CHARS:
            raise Refused("an enum field has a choice that is not a short string")
        out.append((value, _cut(label, _TITLE_CHARS) or value))
    if len({v for v, _ in out}) != len(out):
        raise Refused("an enum field lists a choice twice")
    return tuple(out)


def _field(name: str, prop: Any, required: bool) -> FormField:
    if not isinstance(name, str) or not _FIELD_NAME.fullmatch(name):  # "$" of match passes a final "\n"
        raise Refused(f"a field name is not 1-64 of [A-Za-z0-9_.-]: {_cut(name, 40)!r}")
    if not isinstance(prop, dict):
        raise Refused(f"field {name!r} is not a schema object")
    kind = prop.get("type")
    common: dict[str, Any] = {"name": name, "required": required, "title": _cut(prop.get("title"), _TITLE_CHARS),
                              "description": _cut(prop.get("description"), _DESCRIPTION_CHARS)}
    if kind == "array":
        items = prop.get("items")
        options = _options(items) if isinstance(items, dict) else None
        if options is None:
            raise Refused(f"field {name!r} is an array that is not a multi-select of strings")
        default = prop.get("default")
        if default is not None and (not isinstance(default, list) or any(d not in dict(options) for d in default)):
            default = None
        return FormField(kind="multi", options=options, default=default, min_items=_count(prop.get("minItems")),
                         max_items=_count(prop.get("maxItems")), **common)
    if kind == "string":
        options = _options(prop)
        if options is not None:
            default = prop.get("default") if prop.get("default") in dict(options) else None
            return FormField(kind="enum", options=options, default=default, **common)
        fmt = prop.get("format")
        if fmt is not None and fmt not in _STRING_FORMATS:
            # "password" lands here too, but secret_fields() sees it first
            raise Refused(f"field {name!r} has the unsupported string format {_cut(fmt, 40)!r}")
        default = prop.get("default") if isinstance(prop.get("default"), str) else None
        if default is not None and len(default) > MAX_ANSWER_CHARS:
            default = None
        return FormField(kind="string", format=fmt, default=default, min_length=_count(prop.get("minLength")),
                         max_length=_count(prop.get("maxLength")), **common)
    if kind in ("number", "integer"):
        default = _num(prop.get("default"))
        if kind == "integer" and default is not None and not float(default).is_integer():
            default = None
        return FormField(kind=kind, minimum=_num(prop.get("minimum")), maximum=_num(prop.get("maximum")),
                         default=(int(default) if kind == "integer" and default is not None else default), **common)
    if kind == "boolean":
        default = prop.get("default") if isinstance(prop.get("default"), bool) else None
        return FormField(kind="boolean", default=default, **common)
    raise Refused(f"field {name!r} has the unsupported type {_cut(str(kind), 40)!r} (a form has flat fields only)")


def secret_fields(schema: Any) -> list[str]:
    """The names of the fields of ``schema`` that look like they ask for a credential."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return []
    found = []
    for name, prop in props.items():
        prop = prop if isinstance(prop, dict) else {}
        words = " ".join(str(x) for x in (name, prop.get("title", ""), prop.get("description", "")))
        words += " " + re.sub(r"(?<=[a-z])(?=[A-Z])", " ", str(name))
        if (_SECRETISH.search(words.replace("_", " ")) or _SECRETISH.search(words)
                or prop.get("format") == "password" or prop.get("writeOnly") is True):
            found.append(str(name)[:64])
    return found


def parse_form(message: Any, schema: Any) -> tuple[str, tuple[FormField, ...]]:
    """A request's message and requested schema -> (message cut to size, fields). Raises :class:`Refused`."""
    try:
        size = len(canonical_json(schema).encode())
    except (TypeError, ValueError, RecursionError):
        raise Refused("the requested schema cannot be read") from None
    if size > MAX_SCHEMA_BYTES:
        raise Refused(f"the requested schema is {size} bytes (limit {MAX_SCHEMA_BYTES})", kind="limit")
    if not isinstance(schema, dict) or schema.get("type") != "object" or not isinstance(
            schema.get("properties", {}), dict):
        raise Refused("the requested schema is not a flat object of fields")
    secrets = secret_fields(schema)
    if secrets:
        raise Refused("it asks for " + ", ".join(repr(s) for s in secrets[:5])
                      + ", which looks like a credential: relay does not pass secrets to MCP servers through a "
                        "form (configure the server's credentials in mcp.json instead)", kind="secret")
    props: dict[str, Any] = schema.get("properties", {})
    if len(props) > MAX_FIELDS:
        raise Refused(f"the form has {len(props)} fields (limit {MAX_FIELDS})", kind="limit")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise Refused("the requested schema's 'required' is not a list of field names")
    if set(required) - set(props):
        raise Refused("the requested schema requires a field it does not define")
    fields = tuple(_field(name, prop, name in required) for name, prop in props.items())
    text = _cut(message, MAX_MESSAGE_CHARS)
    if not text.strip():
        raise Refused("the request has no message saying what it is for")
    return text, fields


MAX_URL_CHARS = 2048


def parse_url_request(message: Any, url: Any) -> tuple[str, str, str]:
    """A URL-mode request -> ``(message cut to size, url, host)``. Raises :class:`Refused` (kind ``url``) for a
    link that is not https (or http to a loopback host), carries a user name or password, has control
    characters or spaces, has no host, or is longer than :data:`MAX_URL_CHARS`."""
    from urllib.parse import urlsplit

    from .policy import is_loopback_host

    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise Refused(f"the link is missing or longer than {MAX_URL_CHARS} characters", kind="url")
    if any(ord(c) < 0x21 or ord(c) == 0x7F or c in "\u2028\u2029\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
           for c in url):
        raise Refused("the link has spaces or control characters", kind="url")
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        _port = parts.port
    except ValueError:
        raise Refused("the link cannot be read", kind="url") from None
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise Refused("the link carries a user name or password", kind="url")
    if not host or not (parts.scheme == "https" or (parts.scheme == "http" and is_loopback_host(host))):
        raise Refused("the link is not https (plain http only to this machine)", kind="url")
    text = _cut(message, MAX_MESSAGE_CHARS)
    if not text.strip():
        raise Refused("the request has no message saying what the page is for", kind="url")
    try:  # an internationalised host is shown as the ASCII the browser really asks for (lookalike letters)
        shown = host if host.isascii() else host.encode("idna").decode("ascii")
    except UnicodeError:
        raise Refused("the link's host cannot be read", kind="url") from None
    return text, url, shown


def defaults_of(schema: Any) -> dict[str, Any]:
    """The defaults of a requested schema's fields (what an unchanged card submits; SEP-1034)."""
    try:
        _message, fields = parse_form("defaults", schema)
    except Refused:
        return {}
    return {f.name: f.default for f in fields if f.default is not None}


def _check_value(f: FormField, value: Any) -> Any:
    label = f.title or f.name
    if f.kind == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"{label}: expected true or false")
        return value
    if f.kind in ("number", "integer"):
        number = _num(value)
        if number is None or (f.kind == "integer" and not number.is_integer()):
            raise ValueError(f"{label}: expected {'a whole number' if f.kind == 'integer' else 'a number'}")
        if (f.minimum is not None and number < f.minimum) or (f.maximum is not None and number > f.maximum):
            raise ValueError(f"{label}: must be between {f.minimum} and {f.maximum}")
        return int(number) if f.kind == "integer" else value
    if f.kind == "enum":
        if value not in dict(f.options):
            raise ValueError(f"{label}: not one of the offered choices")
        return value
    if f.kind == "multi":
        if not isinstance(value, list) or any(v not in dict(f.options) for v in value) or len(set(value)) != len(value):
            raise ValueError(f"{label}: pick from the offered choices, each once")
        if (f.min_items is not None and len(value) < f.min_items) or (f.max_items is not None and len(value) > f.max_items):
            raise ValueError(f"{label}: pick between {f.min_items or 0} and {f.max_items} choices")
        return value
    if not isinstance(value, str) or len(value) > MAX_ANSWER_CHARS:
        raise ValueError(f"{label}: expected text of at most {MAX_ANSWER_CHARS} characters")
    if (f.min_length is not None and len(value) < f.min_length) or (f.max_length is not None and len(value) > f.max_length):
        raise ValueError(f"{label}: must be {f.min_length or 0} to {f.max_length} characters")
    return value


def check_answer(fields: tuple[FormField, ...] | list[FormField], content: Any) -> dict[str, Any]:
    """An accepted answer's content, checked against the form: known fields only, the right types,
    bounds and choices, every required field present. Raises ValueError with a one-line message."""
    if not isinstance(content, dict):
        raise ValueError("an accepted answer is an object of field values")
    by_name = {f.name: f for f in fields}
    unknown = set(content) - set(by_name)
    if unknown:
        raise ValueError(f"unknown field {sorted(unknown)[0][:64]!r}")
    out: dict[str, Any] = {}
    for f in fields:
        value = content.get(f.name)
        if value is None or (value == "" and f.kind == "string"):
            if f.required:  # an empty required text box is a missing answer, not an answer
                raise ValueError(f"{f.title or f.name}: required")
            continue
        out[f.name] = _check_value(f, value)
    return out
