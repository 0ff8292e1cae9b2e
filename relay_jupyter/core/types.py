"""Typed values shared by every layer: tool classes, tools, calls, grants, budgets, usage, audit.

snake_case in Python; the wire form (protocol/) may alias to camelCase. Frozen where a value is a fact.
"""

from __future__ import annotations

import hashlib
import json
import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ToolClass",
    "PermissionMode",
    "ConsentDecision",
    "ConsentScope",
    "ToolSpec",
    "ToolRequest",
    "ConsentRequest",
    "ConsentResult",
    "Budget",
    "ProfileBudget",
    "Grant",
    "Usage",
    "AuditRecord",
    "Event",
    "stricter",
    "canonical_json",
]


def canonical_json(value: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces) used for digests."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class ToolClass(StrEnum):
    """Safety class of a tool call (docs/gate.md §8). Order matters: later is stricter."""

    READ = "read"
    """Proven to change nothing. Runs without consent."""
    CONTAINED = "contained"
    """Changes only the conversation's scratch workspace. Runs in every mode."""
    WRITE = "write"
    """Everything else. Needs per-action consent (or review / full mode)."""

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {ToolClass.READ: 0, ToolClass.CONTAINED: 1, ToolClass.WRITE: 2}


def stricter(a: ToolClass, b: ToolClass | None) -> ToolClass:
    """The stricter of two classes. Outside hints may only ever make a class stricter."""
    if b is None:
        return a
    return a if a.rank >= b.rank else b


class PermissionMode(StrEnum):
    ASK = "ask"
    """Default: every write waits for a human click."""
    REVIEW = "review"
    """A reviewer model judges each write; any error, timeout or malformed verdict denies."""
    FULL = "full"
    """No consent. Every structural boundary (paths, quotas, schemas, budgets) still holds."""


class ConsentDecision(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    TIMEOUT = "timeout"


class ConsentScope(StrEnum):
    """How far an ALLOW reaches."""

    ONCE = "once"
    RUN = "run"
    """Allow this tool for the rest of this run."""
    NOTEBOOK = "notebook"
    """Saved trust for this origin, bound to the tool's digest."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolSpec(_Frozen):
    """A tool as the broker knows it. ``name`` is unique (MCP tools are ``server__tool``)."""

    name: str
    """Unique tool name as the model sees it."""
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    """JSON Schema of the arguments (object root)."""
    tool_class: ToolClass = ToolClass.WRITE
    """Safety class; unknown tools are WRITE."""
    server: str | None = None
    """MCP server name, or None for a built-in (scratch, kernel) tool."""
    source: str = ""
    """What the tool runs against: an MCP server's command line or URL; '' for built-ins. Part of the digest."""
    parallel_safe: bool = False
    """May run concurrently with other parallel-safe calls of the same turn."""
    hints: dict[str, Any] = Field(default_factory=dict)
    """Outside hints (MCP annotations). Shown to the user only; never widen the class."""
    runs_code: bool = False
    """Runs code the model wrote in the user's kernel (``run_code``): approved one call at a time —
    no run-scoped allow, no saved trust (docs/security.md: kernel code can act as the user)."""

    @property
    def digest(self) -> str:
        """SHA-256 over what a pin or saved trust is bound to: source, name, description, schema."""
        body = canonical_json([self.source, self.name, self.description, self.input_schema])
        return hashlib.sha256(body.encode()).hexdigest()

    @property
    def key(self) -> tuple[str, str]:
        """``(server, tool)``: what pins and saved trust are keyed by, as two separate values, never the
        joined ``server__tool`` (a joined string is where two servers' names could meet). ``server`` is
        ``""`` for relay's own tools; ``tool`` is the MCP server's own name for it (the part after
        ``<server>__``, the separator of ``mcp/discovery.py``)."""
        if not self.server:
            return ("", self.name)
        prefix = self.server + "__"
        return (self.server, self.name[len(prefix):] if self.name.startswith(prefix) else self.name)


class ToolRequest(_Frozen):
    """One tool call on its way through the gate."""

    origin: str
    """Who is asking: ``notebook:<path>#<kernel_id>`` or ``daemon:<name>``. Derived by the broker."""
    tool: ToolSpec
    arguments: dict[str, Any] = Field(default_factory=dict)
    call_id: str
    run_id: str | None = None
    conversation: str | None = None
    originator: str | None = None
    """Client id allowed to answer a consent request for this call."""
    mode: PermissionMode = PermissionMode.ASK
    reasons: tuple[str, ...] = ()
    """Local signals from preflight, shown on the consent card (size, digest, head, ...)."""
    preview: dict[str, Any] = Field(default_factory=dict)
    """Structured card data from preflight (e.g. a push's target, sha256, head, diff)."""


class ConsentRequest(_Frozen):
    """What a consent port is asked to decide. Arguments are as the model sent them (cards show them)."""

    request_id: str
    request: ToolRequest
    deadline: float
    """Epoch seconds; at this time the request is denied as PERMISSION_TIMEOUT."""


class ConsentResult(_Frozen):
    decision: ConsentDecision
    scope: ConsentScope = ConsentScope.ONCE
    answered_by: str | None = None
    answered_at: float = Field(default_factory=time.time)
    reason: str = ""


class Budget(_Frozen):
    """Limits attached to a grant. ``None`` means no limit on that axis."""

    requests_per_minute: float | None = 30.0
    tokens_per_day: int | None = 200_000
    cost_per_day_usd: float | None = 5.0
    max_steps_per_run: int | None = 25
    max_tokens_per_run: int | None = 100_000

    def narrows(self, other: Budget) -> bool:
        """True when every limit of ``self`` is at most the matching limit of ``other``."""
        for field in type(self).model_fields:
            mine, theirs = getattr(self, field), getattr(other, field)
            if theirs is None:
                continue
            if mine is None or mine > theirs:
                return False
        return True


class ProfileBudget(_Frozen):
    """A grant's own day limits for the model requests it sends to one profile (``c.RelayApp.profiles``,
    docs/proxy.md): counted apart, on the ledger row ``<origin>|profile:<name>``, and in addition to the grant's
    budget (a request to the profile must fit both). ``None``: no limit on that axis."""

    profile: str = Field(min_length=1, max_length=64)
    tokens_per_day: int | None = Field(default=None, ge=0)
    cost_per_day_usd: float | None = Field(default=None, ge=0)

    def limits(self) -> bool:
        """True when it limits anything."""
        return self.tokens_per_day is not None or self.cost_per_day_usd is not None


class Grant(_Frozen):
    """What one origin may do. Persisted; narrowing-only without a fresh consent record."""

    origin: str
    tools: frozenset[str] = frozenset()
    """Allowed tool names; ``"*"`` allows every tool (still gated by class)."""
    models: frozenset[str] = frozenset()
    """Allowed model ids; ``"*"`` allows every model the broker allows."""
    proxy_tools: frozenset[str] | None = None
    """The ``tool_use`` / ``tool_calls`` names an answer relayed to this origin by the model endpoints
    (``relay/anthropic``, ``relay/openai``) may carry; a block for another tool is replaced by a text saying
    relay refused it (docs/proxy.md). None: not restricted (the default); ``"*"``: every tool."""
    profiles: frozenset[str] = frozenset()
    """Named upstreams (``c.RelayApp.profiles``) this origin's model-endpoint requests may pick with
    ``X-Relay-Profile``; ``"*"``: every profile. The broker's own upstream needs no listing."""
    budget: Budget = Field(default_factory=Budget)
    profile_budgets: tuple[ProfileBudget, ...] = ()
    """Day limits per profile (one entry per profile name), besides :attr:`budget`: e.g. the ``team`` profile
    capped at 50,000 tokens a day while the grant's budget still bounds everything (docs/proxy.md)."""
    expires_at: float | None = None
    created_at: float = Field(default_factory=time.time)
    consent_id: str
    """Id of the human consent record (a click on a connect card, a terminal command) behind this grant."""

    def allows_tool(self, name: str) -> bool:
        return "*" in self.tools or name in self.tools

    def allows_model(self, model: str) -> bool:
        return "*" in self.models or model in self.models

    @field_validator("profile_budgets")
    @classmethod
    def _one_budget_per_profile(cls, value: tuple[ProfileBudget, ...]) -> tuple[ProfileBudget, ...]:
        names = [b.profile for b in value]
        if len(set(names)) != len(names):
            raise ValueError("profile_budgets names a profile twice")
        return tuple(sorted(value, key=lambda b: b.profile))

    def profile_budget(self, profile: str | None) -> ProfileBudget | None:
        """The day limits of requests to ``profile`` (None: none besides :attr:`budget`)."""
        if profile is None:
            return None
        return next((b for b in self.profile_budgets if b.profile == profile and b.limits()), None)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class Usage(_Frozen):
    """Token usage of one model request (Anthropic field names; cache tokens included)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    @property
    def total(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_creation_input_tokens
            + self.cache_read_input_tokens
        )


class AuditRecord(_Frozen):
    """One decision, as written to the audit log. ``arguments`` are redacted before they get here."""

    seq: int = 0
    """Assigned by the audit log on append."""
    ts: float
    origin: str
    tool: str
    tool_class: ToolClass | None = None
    decision: str
    """``allow`` | ``deny`` | ``error`` | ``ok`` (executed) ..."""
    code: str | None = None
    """Refusal code when denied."""
    duration_ms: float = 0.0
    run_id: str | None = None
    call_id: str | None = None
    answered_by: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Redacted arguments: secrets masked, long strings cut."""


class Event(_Frozen):
    """One entry of the ordered event stream (stored, replayed over SSE)."""

    id: int
    ts: float
    type: str
    origin: str | None = None
    """Only this origin (and its owner's browser session) may see the event; None = broadcast."""
    run_id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
