"""Names shared by the broker and its clients: RPC methods and event types.

The authoritative description of each (params, result, data fields) is ``docs/protocol.md``.
"""

from __future__ import annotations

__all__ = ["Method", "EventType", "TERMINAL_EVENTS"]


class Method:
    # runs (runtime)
    RUN_START = "run.start"              # {conversation, prompt, attachments, model, backend, mode, ...} -> {run_id}
    RUN_CANCEL = "run.cancel"            # {run_id} -> {cancelled}
    # consent
    PERMISSION_ANSWER = "permission.answer"  # {request_id, decision: allow|deny, scope: once|run|notebook}
    PERMISSION_PENDING = "permission.pending"  # {} -> {requests: [...]} pending requests of the caller
    # elicitation (an MCP server asks the user, during a tool call)
    ELICITATION_ANSWER = "elicitation.answer"  # {request_id, action: accept|decline|cancel, content?}
    ELICITATION_PENDING = "elicitation.pending"  # {} -> {requests: [...]} pending elicitations of the caller
    # MCP OAuth sign-in (an HTTP MCP server that answers 401 with OAuth metadata)
    MCP_SIGN_IN = "mcp.sign_in"          # {server} -> {sign_in_id, server, state, authorization_url?, message}
    MCP_SIGN_IN_WAIT = "mcp.sign_in_wait"  # {sign_in_id, timeout?} -> {sign_in_id, server, state, message}
    MCP_SIGN_OUT = "mcp.sign_out"        # {server} -> {server, signed_out}
    MCP_SIGN_INS = "mcp.sign_ins"        # {} -> {servers: [{server, host, state, has_token, sign_in_id?, ...}]}
    # MCP prompts (``%agent --prompt server:name``)
    MCP_PROMPTS_LIST = "mcp.prompts_list"  # {server?} -> {prompts: [{server, name, description, arguments}], problems}
    MCP_PROMPT_GET = "mcp.prompt_get"    # {server, name, arguments} -> {server, name, messages, text, truncated}
    # tools
    TOOLS_LIST = "tools.list"            # {conversation?} -> {tools: [{name, class, server, description}]}
    TOOLS_CALL = "tools.call"            # {conversation, tool, arguments} -> {content, is_error}
    KERNEL_TOOL_RESULT = "kernel.tool_result"  # {request_id, content, is_error} (kernel answers a kernel-tool request)
    KERNEL_ENDED = "kernel.ended"  # {reason} -> {withdrawn, cancelled_runs} the caller's kernel is gone (hub thin client)
    # grants, budgets, audit, runs (control)
    GRANTS_GET = "grants.get"            # {} -> {grant | null} for the caller's own origin
    GRANTS_DEFAULTS = "grants.defaults"  # {} -> {tools} the tools the connect card pre-checks (default_tools)
    GRANTS_CREATE = "grants.create"      # {tools, models, budget, expires_in?} connect card click -> {grant}
    GRANTS_LIST = "grants.list"
    GRANTS_REVOKE = "grants.revoke"
    BUDGET_GET = "budget.get"
    AUDIT_TAIL = "audit.tail"
    RUNS_LIST = "runs.list"
    RUNS_GET = "runs.get"
    RUNS_CANCEL = "runs.cancel"
    KILL = "kill"
    # conversations
    CONVERSATIONS_LIST = "conversations.list"
    CONVERSATIONS_FORK = "conversations.fork"   # {conversation, at_turn} drop that turn and later ones
    CONVERSATIONS_DELETE = "conversations.delete"
    # workspace
    CHECKPOINTS_LIST = "checkpoints.list"
    CHECKPOINTS_REVERT = "checkpoints.revert"
    WORKSPACE_DIFF = "workspace.diff"    # {conversation, path} -> {diff} workspace file vs its target (relay.diff)
    # trust
    TRUST_LIST = "trust.list"
    TRUST_REVOKE = "trust.revoke"
    # telemetry (docs/telemetry.md)
    TELEMETRY_QUERY = "telemetry.query"  # {since?, limit?, origin?} -> {rows: [TelemetryRow]}


class EventType:
    RUN_STARTED = "run.started"                  # {run_id, conversation, model, backend, engine, mode, originator}
    TEXT_DELTA = "run.text_delta"                # {run_id, text} (coalesced)
    TOOL_PROPOSED = "run.tool_proposed"          # {run_id, call_id, tool, arguments}
    TOOL_VALIDATED = "run.tool_validated"        # {run_id, call_id, tool_class}
    TOOL_DECIDED = "run.tool_decided"            # {run_id, call_id, decision, code?}
    TOOL_STARTED = "run.tool_started"            # {run_id, call_id}
    TOOL_FINISHED = "run.tool_finished"          # {run_id, call_id, is_error, summary, duration_ms}
    USAGE = "run.usage"                          # {run_id, input_tokens, output_tokens, cache_*, cost_usd, basis}
    STEP = "run.step"                            # {run_id, step}
    TURN = "run.turn"                            # {run_id, turn, forked_at, parent_cells} (history loaded)
    REVIEW = "run.review"                        # {run_id, call_id, verdict, reason, failed, model} (review mode)
    # exactly one terminal event per run
    DONE = "run.done"
    CANCELLED = "run.cancelled"
    ERROR = "run.error"                          # {run_id, code, message}
    BUDGET_EXHAUSTED = "run.budget_exhausted"
    INTERRUPTED = "run.interrupted"
    # consent
    PERMISSION_REQUEST = "permission.request"    # {request_id, originator, run_id, call_id, tool, server, tool_class,
                                                 #  arguments, reasons, preview, deadline}
    PERMISSION_RESOLVED = "permission.resolved"  # {request_id, decision, scope, answered_by, answered_at}
    PERMISSION_TIMEOUT = "permission_timeout"    # {request_id}
    # elicitation: an MCP server's question during a tool call, shown as a form card
    ELICITATION_REQUEST = "elicitation.request"  # {request_id, originator, run_id, server, tool, message, fields,
                                                 #  deadline, from: "server"}
    ELICITATION_RESOLVED = "elicitation.resolved"  # {request_id, action, answered_by, fields_answered, refused?}
    # kernel tools (broker asks the originating kernel to run list_variables, describe_dataframe, ...)
    KERNEL_TOOL_REQUEST = "kernel.tool_request"  # {request_id, run_id, tool, arguments}
    # control
    GRANT_CHANGED = "grant.changed"
    MCP_SIGN_IN_CHANGED = "mcp.sign_in_changed"  # {server, state: pending|signed_in|failed|signed_out}
    CHECKPOINT = "checkpoint"


TERMINAL_EVENTS = frozenset(
    {EventType.DONE, EventType.CANCELLED, EventType.ERROR, EventType.BUDGET_EXHAUSTED, EventType.INTERRUPTED}
)
