"""The kernel's side of the wire, typed: what a kernel sends and receives, as ``TypedDict``s.

The broker validates every RPC with strict pydantic models (``protocol/models_*.py``,
``protocol/models_workspace.py``). The kernel must not import pydantic (``%load_ext`` stays cheap:
``tests/kernel/test_prewarm.py``), so it gets these plain ``TypedDict`` twins instead: they cost
nothing at run time (a ``dict`` is a ``dict``) and give its code the field names in one place.

``tests/kernel/test_kernel_wire.py`` checks each pair against the broker's registered models
(:data:`KERNEL_METHODS`): the same field names (aliases included, e.g. ``class``), and the same
requiredness -- a params key is ``Required`` exactly when the model field has no default; every
result key is ``Required``, because the broker serialises every field (``model_dump``). Nested
objects (``Grant``, ``Budget``, ``AuditRecord``, ...) are checked the same way, recursively.

Event data have no pydantic model (they are dicts built by the runtime and the router): the
``*Data`` dicts below are checked against the event table of ``docs/protocol.md`` instead, and
:class:`EventEnvelope` against ``core.types.Event``. Event data are read with ``.get`` (a newer
broker may add fields, an older one may lack some), so every event key is ``NotRequired``.
"""

# no ``from __future__ import annotations``: TypedDict reads Required/NotRequired from evaluated annotations
from typing import Any, Literal, NotRequired, Required, TypedDict

__all__ = [
    "KERNEL_EVENTS",
    "KERNEL_METHODS",
    "TelemetryQueryParams",
    "TelemetryQueryResult",
    "TelemetryRowDict",
    "AuditRecordDict",
    "AuditTailParams",
    "AuditTailResult",
    "BudgetDict",
    "BudgetGetResult",
    "CheckpointDict",
    "CheckpointsListParams",
    "CheckpointsListResult",
    "CheckpointsRevertParams",
    "CheckpointsRevertResult",
    "ConversationsForkParams",
    "ConversationsForkResult",
    "ElicitationAnswerParams",
    "ElicitationAnswerResult",
    "EventEnvelope",
    "GrantDict",
    "GrantResult",
    "GrantsCreateParams",
    "GrantsGetResult",
    "GrantsListResult",
    "GrantsRevokeParams",
    "KernelToolRequestData",
    "KernelToolResultParams",
    "KillParams",
    "KillResult",
    "McpServerParams",
    "McpPromptArgument",
    "McpPromptGetParams",
    "McpPromptGetResult",
    "McpPromptInfo",
    "McpPromptMessage",
    "McpPromptsListParams",
    "McpPromptsListResult",
    "McpSignInResult",
    "McpSignInWaitParams",
    "OkResult",
    "OriginParams",
    "PermissionAnswerParams",
    "PermissionAnswerResult",
    "PermissionRequestData",
    "PermissionResolvedData",
    "PermissionTimeoutData",
    "RevokedResult",
    "RunAttachment",
    "RunCancelParams",
    "RunCancelResult",
    "RunErrorData",
    "RunStartParams",
    "RunStartResult",
    "RunStartedData",
    "RunsGetParams",
    "RunsGetResult",
    "RunsListParams",
    "RunsListResult",
    "TextDeltaData",
    "ToolDecidedData",
    "ToolFinishedData",
    "ToolInfoDict",
    "ToolProposedData",
    "ToolValidatedData",
    "ReviewData",
    "ToolsListParams",
    "ToolsListResult",
    "UsageData",
    "WorkspaceDiffParams",
    "WorkspaceDiffResult",
]


# ---------------------------------------------------------------------------------------- shared objects
class BudgetDict(TypedDict, total=False):
    """``core.types.Budget``: None = no limit on that axis (every key optional when sent)."""

    requests_per_minute: float | None
    tokens_per_day: int | None
    cost_per_day_usd: float | None
    max_steps_per_run: int | None
    max_tokens_per_run: int | None


class _BudgetOut(TypedDict):
    """``Budget`` as the broker sends it (every field present)."""

    requests_per_minute: float | None
    tokens_per_day: int | None
    cost_per_day_usd: float | None
    max_steps_per_run: int | None
    max_tokens_per_run: int | None


class ProfileBudgetDict(TypedDict, total=False):
    """``core.types.ProfileBudget`` as sent (``grants.create``'s ``profile_budgets``): day limits of one profile."""

    profile: Required[str]
    tokens_per_day: int | None
    cost_per_day_usd: float | None


class _ProfileBudgetOut(TypedDict):
    """``ProfileBudget`` as the broker sends it (every field present)."""

    profile: str
    tokens_per_day: int | None
    cost_per_day_usd: float | None


class GrantDict(TypedDict):
    """``core.types.Grant`` as the broker sends it."""

    origin: str
    tools: list[str]
    models: list[str]
    proxy_tools: list[str] | None
    profiles: list[str]
    budget: _BudgetOut
    profile_budgets: list[_ProfileBudgetOut]
    expires_at: float | None
    created_at: float
    consent_id: str


class AuditRecordDict(TypedDict):
    """``core.types.AuditRecord`` (arguments already redacted by the broker)."""

    seq: int
    ts: float
    origin: str
    tool: str
    tool_class: str | None
    decision: str
    code: str | None
    duration_ms: float
    run_id: str | None
    call_id: str | None
    answered_by: str | None
    arguments: dict[str, Any]


#: One ``tools.list`` entry; ``class`` (the wire name of ``ToolInfo.tool_class``) is a Python keyword, hence
#: the functional syntax.
ToolInfoDict = TypedDict("ToolInfoDict", {
    "name": str, "class": str, "server": str | None, "description": str, "input_schema": dict[str, Any],
    "allowed": bool,
})


class CheckpointDict(TypedDict):
    """One ``checkpoints.list`` entry (``protocol/models_workspace.CheckpointInfo``)."""

    id: str
    target: str
    state: str
    run_id: str
    conversation: str | None
    created_at: float
    updated_at: float
    pre_exists: bool
    pre_sha256: str | None
    post_sha256: str | None
    note: str


# ---------------------------------------------------------------------------------------- RPC params/results
class OriginParams(TypedDict, total=False):
    """``grants.get``, ``grants.list``, ``budget.get``: a kernel omits ``origin`` (it acts for itself)."""

    origin: str | None


class GrantsGetResult(TypedDict):
    grant: GrantDict | None


class GrantsDefaultsResult(TypedDict):
    tools: list[str]
    """What the connect card pre-checks: tool names, ``*`` for every tool offered."""


class GrantsCreateParams(TypedDict, total=False):
    tools: list[str]
    models: list[str]
    proxy_tools: list[str] | None
    profiles: list[str]
    budget: BudgetDict | None
    profile_budgets: list[ProfileBudgetDict]
    expires_in: float | None
    origin: str | None


class GrantResult(TypedDict):
    grant: GrantDict


class GrantsListResult(TypedDict):
    grants: list[GrantDict]


class GrantsRevokeParams(TypedDict, total=False):
    origin: str | None


class RevokedResult(TypedDict):
    revoked: bool


class BudgetGetResult(TypedDict):
    origin: str
    usage: dict[str, Any]


class AuditTailParams(TypedDict, total=False):
    n: int
    origin: str | None
    origin_prefix: str | None
    tool: str | None
    decision: str | None


class AuditTailResult(TypedDict):
    records: list[AuditRecordDict]


class TelemetryRowDict(TypedDict):
    """``core.telemetry.TelemetryRow``: one model request, figures and ids only."""

    id: int
    ts: float
    origin: str
    source: str
    model: str
    session: str | None
    lineage: str | None
    run_id: str | None
    profile: str | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    estimated: bool
    latency_ms: float
    ttft_ms: float | None
    status: str
    error_code: str | None


class TelemetryQueryParams(TypedDict, total=False):
    since: float | None
    limit: int
    origin: str | None
    origin_prefix: str | None


class TelemetryQueryResult(TypedDict):
    rows: list[TelemetryRowDict]


class RunsListParams(TypedDict, total=False):
    origin: str | None
    limit: int
    origin_prefix: str | None


class RunsListResult(TypedDict):
    runs: list[dict[str, Any]]


class RunsGetParams(TypedDict):
    run_id: str


class RunsGetResult(TypedDict):
    run: dict[str, Any]


class KillParams(TypedDict, total=False):
    origin: str | None
    all: bool


class KillResult(TypedDict):
    cancelled_runs: int
    denied_requests: int


class PermissionAnswerParams(TypedDict):
    request_id: Required[str]
    decision: Required[Literal["allow", "deny"]]
    scope: NotRequired[Literal["once", "run", "notebook"]]


class PermissionAnswerResult(TypedDict):
    request_id: str
    decision: str
    scope: str
    answered_by: str | None
    answered_at: float


class KernelToolResultParams(TypedDict):
    request_id: Required[str]
    content: NotRequired[Any]
    is_error: NotRequired[bool]


class OkResult(TypedDict):
    ok: bool


class ToolsListParams(TypedDict, total=False):
    conversation: str | None
    origin: str | None


class ToolsListResult(TypedDict):
    tools: list[ToolInfoDict]


class RunAttachment(TypedDict):
    """``protocol.models_runs.Attachment``: untrusted material sent with a prompt."""

    label: str
    content: str


class RunStartParams(TypedDict):
    conversation: Required[str]
    prompt: Required[str]
    attachments: NotRequired[list[RunAttachment]]
    model: NotRequired[str | None]
    backend: NotRequired[str | None]
    engine: NotRequired[str | None]
    profile: NotRequired[str | None]
    mode: NotRequired[Literal["ask", "review", "full"]]
    max_tokens: NotRequired[int | None]
    tools: NotRequired[list[str] | None]
    origin: NotRequired[str | None]
    cell_id: NotRequired[str | None]


class RunStartResult(TypedDict):
    run_id: str


class RunCancelParams(TypedDict):
    run_id: str


class RunCancelResult(TypedDict):
    cancelled: bool


class ConversationsForkParams(TypedDict):
    conversation: Required[str]
    at_turn: Required[int]
    origin: NotRequired[str | None]


class ConversationsForkResult(TypedDict):
    conversation: str
    removed_messages: int
    turns: int


class CheckpointsListParams(TypedDict, total=False):
    origin: str | None
    limit: int


class CheckpointsListResult(TypedDict):
    checkpoints: list[CheckpointDict]


class CheckpointsRevertParams(TypedDict):
    id: Required[str]
    origin: NotRequired[str | None]


class CheckpointsRevertResult(TypedDict):
    reverted: list[str]
    stopped_at: str | None
    reason: str | None
    complete: bool


class WorkspaceDiffParams(TypedDict):
    conversation: Required[str]
    path: Required[str]
    origin: NotRequired[str | None]


class WorkspaceDiffResult(TypedDict):
    path: str
    diff: str
    target_exists: bool
    note: str


class ElicitationAnswerParams(TypedDict):
    """``elicitation.answer``: the form an MCP server asked the person to fill (docs/mcp.md)."""

    request_id: Required[str]
    action: Required[Literal["accept", "decline", "cancel"]]
    content: NotRequired[dict[str, Any] | None]


class ElicitationAnswerResult(TypedDict):
    request_id: str
    action: str
    answered_by: str


class McpServerParams(TypedDict):
    """``mcp.sign_in``: which HTTP MCP server to sign in to (docs/mcp.md, "OAuth sign-in")."""

    server: Required[str]


class McpSignInWaitParams(TypedDict):
    sign_in_id: Required[str]
    timeout: NotRequired[float]


class McpSignInResult(TypedDict):
    sign_in_id: str
    server: str
    state: Literal["pending", "signed_in", "failed"]
    authorization_url: str | None
    message: str


class McpPromptsListParams(TypedDict):
    """``mcp.prompts_list``: one server's prompts, or those of every server the grant reaches."""

    server: NotRequired[str | None]
    origin: NotRequired[str | None]


class McpPromptArgument(TypedDict):
    name: str
    description: str
    required: bool


class McpPromptInfo(TypedDict):
    server: str
    name: str
    description: str
    arguments: list[McpPromptArgument]


class McpPromptsListResult(TypedDict):
    prompts: list[McpPromptInfo]
    problems: dict[str, str]


class McpPromptGetParams(TypedDict):
    """``mcp.prompt_get``: ``%agent --prompt server:name --arg k=v``."""

    server: Required[str]
    name: Required[str]
    arguments: NotRequired[dict[str, str]]
    origin: NotRequired[str | None]


class McpPromptMessage(TypedDict):
    role: str
    text: str


class McpPromptGetResult(TypedDict):
    server: str
    name: str
    messages: list[McpPromptMessage]
    text: str
    truncated: bool


#: Every RPC method the kernel calls -> (params, result). The test compares each with the broker's models.
KERNEL_METHODS: dict[str, tuple[type, type]] = {
    "grants.get": (OriginParams, GrantsGetResult),
    "grants.defaults": (OriginParams, GrantsDefaultsResult),
    "grants.create": (GrantsCreateParams, GrantResult),
    "grants.list": (OriginParams, GrantsListResult),
    "grants.revoke": (GrantsRevokeParams, RevokedResult),
    "budget.get": (OriginParams, BudgetGetResult),
    "audit.tail": (AuditTailParams, AuditTailResult),
    "telemetry.query": (TelemetryQueryParams, TelemetryQueryResult),
    "runs.list": (RunsListParams, RunsListResult),
    "runs.get": (RunsGetParams, RunsGetResult),
    "kill": (KillParams, KillResult),
    "permission.answer": (PermissionAnswerParams, PermissionAnswerResult),
    "kernel.tool_result": (KernelToolResultParams, OkResult),
    "tools.list": (ToolsListParams, ToolsListResult),
    "run.start": (RunStartParams, RunStartResult),
    "run.cancel": (RunCancelParams, RunCancelResult),
    "conversations.fork": (ConversationsForkParams, ConversationsForkResult),
    "checkpoints.list": (CheckpointsListParams, CheckpointsListResult),
    "checkpoints.revert": (CheckpointsRevertParams, CheckpointsRevertResult),
    "workspace.diff": (WorkspaceDiffParams, WorkspaceDiffResult),
    "elicitation.answer": (ElicitationAnswerParams, ElicitationAnswerResult),
    "mcp.sign_in": (McpServerParams, McpSignInResult),
    "mcp.sign_in_wait": (McpSignInWaitParams, McpSignInResult),
    "mcp.prompts_list": (McpPromptsListParams, McpPromptsListResult),
    "mcp.prompt_get": (McpPromptGetParams, McpPromptGetResult),
}


# ---------------------------------------------------------------------------------------- events
class EventEnvelope(TypedDict, total=False):
    """One SSE event (``core.types.Event``): ``data`` holds one of the ``*Data`` dicts below."""

    id: int
    ts: float
    type: str
    origin: str | None
    run_id: str | None
    data: dict[str, Any]


class RunStartedData(TypedDict, total=False):
    run_id: str
    conversation: str
    model: str
    backend: str
    engine: str
    mode: str
    originator: str
    profile: str


class TextDeltaData(TypedDict, total=False):
    run_id: str
    text: str


class ToolProposedData(TypedDict, total=False):
    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]


class ToolValidatedData(TypedDict, total=False):
    run_id: str
    call_id: str
    tool_class: str


class ReviewData(TypedDict, total=False):
    """``run.review``: review mode's verdict on a write."""

    run_id: str
    call_id: str
    verdict: str
    reason: str
    failed: bool
    model: str


class ToolDecidedData(TypedDict, total=False):
    run_id: str
    call_id: str
    decision: str
    code: str | None


class ToolFinishedData(TypedDict, total=False):
    run_id: str
    call_id: str
    is_error: bool
    summary: str
    duration_ms: float


class UsageData(TypedDict, total=False):
    run_id: str
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cost_usd: float
    basis: str


class RunErrorData(TypedDict, total=False):
    """``run.error`` (other terminal events carry at most ``run_id`` and ``message``)."""

    run_id: str
    code: str
    message: str
    incomplete: bool


class PermissionRequestData(TypedDict, total=False):
    request_id: str
    originator: str
    origin: str
    run_id: str
    call_id: str
    conversation: str
    tool: str
    server: str | None
    tool_class: str
    description: str
    arguments: dict[str, Any]
    reasons: list[str]
    preview: dict[str, Any]
    deadline: float
    scopes: list[str]
    tool_changed: dict[str, Any]


class PermissionResolvedData(TypedDict, total=False):
    request_id: str
    decision: str
    scope: str
    answered_by: str | None
    answered_at: float
    reason: str


class PermissionTimeoutData(TypedDict, total=False):
    request_id: str


class KernelToolRequestData(TypedDict, total=False):
    request_id: str
    run_id: str
    tool: str
    arguments: dict[str, Any]
    client_id: str


#: Every event type the kernel reads -> its data dict (checked against docs/protocol.md's event table).
KERNEL_EVENTS: dict[str, type] = {
    "run.started": RunStartedData,
    "run.text_delta": TextDeltaData,
    "run.tool_proposed": ToolProposedData,
    "run.tool_validated": ToolValidatedData,
    "run.review": ReviewData,
    "run.tool_decided": ToolDecidedData,
    "run.tool_finished": ToolFinishedData,
    "run.usage": UsageData,
    "run.error": RunErrorData,
    "permission.request": PermissionRequestData,
    "permission.resolved": PermissionResolvedData,
    "permission_timeout": PermissionTimeoutData,
    "kernel.tool_request": KernelToolRequestData,
}
