"""Wire models of the control, permission, kernel-tool and tools methods.

Every model forbids unknown fields: a typo in a client is an error (-32602), not a silently
ignored option. ``origin`` parameters are only meaningful for a browser session (the side
panel acts for every notebook of its server); a kernel always acts for its own origin and
naming another one is refused.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..core.types import AuditRecord, Budget, Grant, ProfileBudget
from .models_runs import ConversationName
from .strict import Strict

__all__ = [
    "AuditTailParams",
    "AuditTailResult",
    "BudgetGetResult",
    "CancelledResult",
    "Empty",
    "GrantResult",
    "GrantsCreateParams",
    "GrantsDefaultsResult",
    "GrantsGetResult",
    "GrantsListResult",
    "GrantsRevokeParams",
    "KernelEndedParams",
    "KernelEndedResult",
    "KernelToolResultParams",
    "KillParams",
    "KillResult",
    "OkResult",
    "OriginParams",
    "PermissionAnswerParams",
    "PermissionAnswerResult",
    "PermissionPendingResult",
    "RevokedResult",
    "RunsCancelParams",
    "RunsGetParams",
    "RunsGetResult",
    "RunsListParams",
    "RunsListResult",
    "Strict",
    "ToolInfo",
    "ToolsCallParams",
    "ToolsCallResult",
    "ToolsListParams",
    "ToolsListResult",
    "TrustListResult",
    "TrustRevokeParams",
]

_ID = Field(min_length=1, max_length=200)
_ORIGIN = Field(default=None, min_length=1, max_length=4096)


class Empty(Strict):
    """No parameters."""


class OriginParams(Strict):
    origin: str | None = _ORIGIN
    """Browser only: the origin to act on. A kernel omits it (or names its own)."""


class GrantsGetResult(Strict):
    grant: Grant | None
    """The caller's grant, or null when it has none (or it expired)."""


class GrantsDefaultsResult(Strict):
    tools: list[str]
    """What the connect card pre-checks (``c.RelayApp.default_tools``): tool names, ``*`` for every tool offered."""


class GrantsCreateParams(Strict):
    """A connect-card click: the user consents to this grant for the caller's own origin."""

    tools: list[str] = Field(default_factory=list, max_length=500)
    models: list[str] = Field(default_factory=list, max_length=100)
    budget: Budget | None = None
    """Limits; omitted = the default budget."""
    proxy_tools: list[str] | None = Field(default=None, max_length=500)
    """Tool names a relayed model answer may carry (docs/proxy.md); omitted = not restricted."""
    profiles: list[str] = Field(default_factory=list, max_length=100)
    """Named upstreams (``c.RelayApp.profiles``) the model endpoints may use for this origin (docs/proxy.md)."""
    profile_budgets: list[ProfileBudget] = Field(default_factory=list, max_length=100)
    """Day limits per profile, besides ``budget`` (``{"profile": "team", "tokens_per_day": 50000}``)."""
    expires_in: float | None = Field(default=None, gt=0, le=366 * 86_400)
    """Seconds until the grant expires; omitted = no expiry."""
    origin: str | None = _ORIGIN


class GrantResult(Strict):
    grant: Grant


class GrantsListResult(Strict):
    grants: list[Grant]


class GrantsRevokeParams(Strict):
    origin: str | None = _ORIGIN


class RevokedResult(Strict):
    revoked: bool


class BudgetGetResult(Strict):
    origin: str
    usage: dict[str, Any]
    """``BudgetLedger.usage``: tokens, cost_usd, reservations, limits, rpm, day."""


class AuditTailParams(Strict):
    n: int = Field(default=100, ge=1, le=1000)
    origin: str | None = _ORIGIN
    origin_prefix: str | None = _ORIGIN
    """Only records whose origin starts with this (``notebook:reports/``; a hub panel's must be under its user's
    ``user:<name>/``, its default): applied while the log is read, so the n are the newest *matching* ones."""
    tool: str | None = Field(default=None, min_length=1, max_length=512)
    """Only records of this tool (exact: ``run_code``, ``model:claude-sonnet-4-5``, ``grant.create``)."""
    decision: str | None = Field(default=None, min_length=1, max_length=64)
    """Only records with this decision (exact: ``allow``, ``deny``, ``ok``, ...)."""


class AuditTailResult(Strict):
    records: list[AuditRecord]


class RunsListParams(Strict):
    origin: str | None = _ORIGIN
    limit: int = Field(default=100, ge=1, le=1000)
    origin_prefix: str | None = _ORIGIN
    """Only runs whose origin starts with this (a hub panel's must be under ``user:<name>/``, its default): applied
    in the store, so the limit counts matching runs only."""


class RunsListResult(Strict):
    runs: list[dict[str, Any]]


class RunsGetParams(Strict):
    run_id: str = _ID


class RunsGetResult(Strict):
    run: dict[str, Any]


class RunsCancelParams(Strict):
    run_id: str = _ID


class CancelledResult(Strict):
    cancelled: bool


class KillParams(Strict):
    """Cancel every run of one origin (default: the caller's own), or of all origins (browser only)."""

    origin: str | None = _ORIGIN
    all: bool = False


class KillResult(Strict):
    cancelled_runs: int
    denied_requests: int


class PermissionAnswerParams(Strict):
    request_id: str = _ID
    decision: Literal["allow", "deny"]
    scope: Literal["once", "run", "notebook"] = "once"


class PermissionAnswerResult(Strict):
    request_id: str
    decision: str
    scope: str
    answered_by: str | None
    answered_at: float


class PermissionPendingResult(Strict):
    requests: list[dict[str, Any]]
    """The ``permission.request`` event data of every pending request the caller may answer,
    each with its ``event_id``."""


class KernelToolResultParams(Strict):
    request_id: str = _ID
    content: Any = None
    """What the tool produced (text or JSON); cut past 200k characters."""
    is_error: bool = False


class OkResult(Strict):
    ok: bool = True


class KernelEndedParams(Strict):
    reason: Literal["restarted", "shut down", "died"]
    """Why the kernel's life as the originator of its runs ended (server/kernel_auth.install_kernel_lifecycle_hook)."""


class KernelEndedResult(Strict):
    withdrawn: int
    """How many pending permission requests of the caller were withdrawn."""
    cancelled_runs: list[str]


class TrustListResult(Strict):
    trust: list[dict[str, Any]]


class TrustRevokeParams(Strict):
    origin: str | None = _ORIGIN
    tool: str | None = Field(default=None, min_length=1, max_length=400)
    """Omitted: every saved trust of the origin (of ``server``'s tools, when given). Without ``server``: the
    tool as the model sees it (``server__tool`` for an MCP tool, or relay's own tool of that name)."""
    server: str | None = Field(default=None, max_length=64)
    """With ``tool``: exactly ``(server, tool)``, the key saved trust is stored under (``""``: relay's own)."""


class ToolsListParams(Strict):
    conversation: ConversationName | None = None
    origin: str | None = _ORIGIN


class ToolInfo(Strict):
    name: str
    tool_class: str = Field(serialization_alias="class")
    server: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)
    allowed: bool
    """Whether the caller's grant allows this tool (it is still gated by class)."""


class ToolsListResult(Strict):
    tools: list[ToolInfo]


class ToolsCallParams(Strict):
    conversation: ConversationName
    tool: str = Field(min_length=1, max_length=400)
    arguments: dict[str, Any] = Field(default_factory=dict)
    origin: str | None = _ORIGIN
    """Browser only: the notebook the call is made for."""


class ToolsCallResult(Strict):
    content: Any = None
    is_error: bool = False
