"""The ``claude-code`` engine: Claude Code (the ``claude`` CLI, through PyPI ``claude-agent-sdk``) drives the
run's loop, and relay's gate authorises every tool call it proposes (issue 17; docs/engines.md).

Run by the broker, never in a kernel. Per run:

- **Where**: the CLI's working directory is the conversation's scratch workspace; its ``TMPDIR`` is a fresh
  0700 run directory, its ``HOME`` the conversation's own 0700 directory under the relay data dir (no user
  settings, no login, nothing of other conversations; :class:`_Memory`: the next cell resumes the session).
- **Environment built from nothing** (:mod:`relay_jupyter.engines.claude_launch`): ``PATH``, ``HOME``, locale,
  quiet switches, and ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY`` = relay's Anthropic endpoint on loopback
  with a key minted for this run (``broker/engine_endpoint.py``). So every model request of the CLI meets the
  gate (grant, model allowlist, rate/token/cost budgets, audit) and is forwarded with the broker's key, which
  the CLI never sees; no Jupyter token, no broker secret, no kernel credential reaches it.
- **Every tool call through the gate**: a ``PreToolUse`` hook (called for *every* call, including those the CLI
  would auto-allow) and ``can_use_tool`` (called for the calls the CLI would prompt for) both answer from one
  decision per ``tool_use_id``, made by relay's executor (``runtime/executor.py``: the grant, the call's
  class, the gate, consent for writes — a card in ask mode, the reviewer in review mode, allowed in full mode
  — the journal's intent before the CLI runs it and its outcome after, from ``PostToolUse``, and the audit).
  A refusal is the hook's ``deny`` with the reason, which the model reads as the tool's error.
- **Classification** (:func:`classify`): ``Read``/``Glob``/``Grep`` inside the workspace are ``read``;
  elsewhere the read scope of ``scratch_pull``: credentials refused anywhere, outside the Jupyter root
  refused, the root's protected paths refused, under the origin's read roots ``read``, elsewhere in the root
  a ``write`` (a card naming the path). ``Write``/``Edit``/``NotebookEdit``
  inside the workspace are ``contained``; elsewhere refused in every mode (files reach the project only
  through ``scratch_push`` and its card). ``Bash``, ``WebFetch``, ``WebSearch`` and anything unknown are
  ``write``; the card shows the exact command, URL or query.
- **MCP tools**: the CLI's only MCP server is relay's gated MCP gateway with a token for this run; each
  ``mcp__relay__<tool>`` call is decided there, by the one executor — the run's kernel's tools too (``run_code``
  with its card, as in the relay engine), narrowed to the run's ``--tools`` — and journalled and audited under
  the model's ``tool_use`` id, which the ``PreToolUse`` hook announces to the gateway (``broker/gateway_links.py``).
- **Cancel**: the CLI and every process of its session are SIGKILLed (the run ends ``run.cancelled``, once).

SDK options and why (``_options``): ``permission_mode="default"`` (never ``bypassPermissions``, which skips
``can_use_tool``); ``allowed_tools=[]`` (an entry would pre-approve a tool past the gate); ``tools`` = the
built-ins relay classifies (no ``Task`` sub-agents, no ``TodoWrite``); ``setting_sources=[]`` and
``strict_mcp_config=True`` with relay's gateway as the one MCP server (no user or project settings, hooks,
permission rules or MCP servers of the machine apply); ``max_turns`` = the run's step cap; ``include_partial_messages`` for streamed text.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.base import ToolCallDone, model_allowed
from ..core.errors import Code, ConfigRefusal, GateRefusal, Refusal, WorkspaceRefusal
from ..core.types import ToolClass, ToolSpec, Usage
from ..protocol.names import EventType
from ..runtime.driver import Coalescer
from ..runtime.engine import EngineRun
from ..runtime.offload import off_loop, off_loop_or_undo
from ..runtime.tools import Preflight, ToolContext, ToolIndex, ToolResult

__all__ = ["BUILTIN_TOOLS", "ClaudeCodeEngine", "classify", "kill_session"]

log = logging.getLogger(__name__)

#: The Claude Code built-ins offered to the CLI (``options.tools``: what exists, not what is approved).
BUILTIN_TOOLS: tuple[str, ...] = ("Read", "Glob", "Grep", "Write", "Edit", "NotebookEdit", "Bash", "WebFetch",
                                  "WebSearch")
_READS = {"Read": "file_path", "Glob": "path", "Grep": "path"}
_WRITES = {"Write": "file_path", "Edit": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path"}
_SHOWN = {"Bash": "command", "WebFetch": "url", "WebSearch": "query"}
#: The CLI's name for relay's MCP gateway, its only MCP server; its tools are ``mcp__relay__<relay's name>``.
MCP_SERVER = "relay"
MCP_PREFIX = f"mcp__{MCP_SERVER}__"

INSTALL_HINT = "pip install 'relay-jupyter[claude-code]' in the Jupyter server's environment, then restart it"
SYSTEM_APPEND = (
    "You run inside relay, a broker in the user's Jupyter server. Your working directory is a scratch "
    "workspace: write files only there. Every tool call is authorised by relay; a refused call says why — "
    "do not try to work around a refusal.")

#: The call the executor is running in this task (set by the gate task, read by the tool source).
_CALL: contextvars.ContextVar[_Gated | None] = contextvars.ContextVar("relay_claude_code_call", default=None)


# -- classification -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """How relay sees one proposed call: its class (None: refused, with ``refusal``), card lines, preview."""

    tool_class: ToolClass | None
    reasons: tuple[str, ...] = ()
    preview: dict[str, Any] = field(default_factory=dict)
    refusal: str = ""


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _resolve(value: Any, cwd: Path) -> Path | None:
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > 4096:
        return None
    p = Path(value)
    if value.startswith("~"):
        return None  # the CLI's HOME is not the user's: refuse rather than guess what it means
    return Path(os.path.realpath(p if p.is_absolute() else cwd / p))


def _glob_escapes(pattern: Any) -> bool:
    return isinstance(pattern, str) and (pattern.startswith(("/", "~")) or ".." in Path(pattern).parts)


def classify(name: str, args: dict[str, Any], workspace: Path, *, jupyter_root: Path | None = None,
             protected: Any = None, read_roots: Any = None, origin: str | None = None) -> Verdict:
    """The class of one Claude Code built-in call (module docstring). Never raises."""
    ws = Path(os.path.realpath(workspace))
    if name in _READS:
        key = _READS[name]
        raw = args.get(key)
        target = ws if raw in (None, "") and name != "Read" else _resolve(raw, ws)
        patterns = [args.get("pattern")] if name == "Glob" else [args.get("glob")]
        if target is None:
            return Verdict(None, refusal=f"{name} of {str(raw)[:300]!r} is refused: relay needs an absolute path "
                                         "(no ~: the CLI's home is not yours)")
        if protected is not None:
            cred = protected.credential(target)
            if cred:  # anywhere, inside the workspace too (a symlink to it was resolved above)
                return Verdict(None, refusal=f"{name} of {target} is refused: {cred}")
        if any(_glob_escapes(p) for p in patterns):
            return Verdict(ToolClass.WRITE, (f"{name} with a pattern that leaves its directory: "
                                             f"{str(patterns[0])[:300]}",), {"path": str(target)})
        if _inside(target, ws):
            return Verdict(ToolClass.READ, preview={"path": str(target)})
        literal = Path(os.path.abspath(raw if Path(str(raw)).is_absolute() else ws / str(raw))) if raw else target
        return _outside_read(name, target, literal, jupyter_root, protected, read_roots, origin)
    if name in _WRITES:
        key = _WRITES[name]
        target = _resolve(args.get(key), ws)
        if target is not None and _inside(target, ws) and target != ws:
            return Verdict(ToolClass.CONTAINED, preview={"path": str(target)})
        return Verdict(None, refusal=(
            f"{name} outside the scratch workspace is refused ({str(args.get(key))[:300]!r}): Claude Code writes "
            f"only in its workspace ({ws}); files reach the project through scratch_push and its card"))
    if name in _SHOWN:
        key = _SHOWN[name]
        shown = str(args.get(key, ""))[:2000]
        what = {"Bash": "run a shell command", "WebFetch": "fetch a URL", "WebSearch": "search the web"}[name]
        return Verdict(ToolClass.WRITE, (f"Claude Code wants to {what}: {shown}",), {key: shown})
    return Verdict(ToolClass.WRITE, (f"Claude Code tool {name[:100]!r}, which relay does not classify: "
                                     "asked as a write",), {"arguments": json.dumps(args, default=str)[:2000]})


#: How many entries a ``Grep`` outside the workspace may search (each checked against the refusal rules).
GREP_SCAN_LIMIT = 5000


def _outside_read(name: str, target: Path, literal: Path, root: Path | None, protected: Any, read_roots: Any,
                  origin: str | None) -> Verdict:
    """The read scope of ``scratch_pull`` (docs/workspace.md "Reads are scoped"), for Claude Code's reads:
    credentials and protected paths refused, outside the Jupyter root refused, under the origin's read
    roots a read, anywhere else in the root a write whose card names the path."""
    if root is None or protected is None:
        return Verdict(None, refusal=f"{name} outside the scratch workspace is refused ({target})")
    below = protected.below_root(target)
    if below is None:
        return Verdict(None, refusal=f"{name} of {target} is refused: it is outside the Jupyter root")
    below = tuple(below)
    if below:
        reason = protected.reason(below, target)
    else:
        reason = None if name in ("Glob", "Grep") else "it is the Jupyter root itself"
    if reason:
        return Verdict(None, refusal=f"{name} of {target} is refused: {reason}")
    if name == "Grep" and target.is_dir():
        # a search reads every file below: each must be one relay would let the agent read
        problem = _unreadable_below(target, protected)
        if problem:
            return Verdict(None, refusal=f"Grep of {target} is refused: {problem}; search a narrower directory")
    literal_below = protected.below_root(literal)
    if read_roots is not None and read_roots.covers(origin, below, tuple(literal_below) if literal_below is not None
                                                    else None):
        return Verdict(ToolClass.READ, preview={"path": str(target)})
    roots = read_roots.describe(origin) if read_roots is not None else "none"
    return Verdict(ToolClass.WRITE, (f"Claude Code wants to read {target}, outside its scratch workspace and this "
                                     f"notebook's read roots ({roots}); what it reads goes to the model provider",),
                   {"path": str(target)})


def _unreadable_below(directory: Path, protected: Any) -> str | None:
    """Why a search of ``directory`` could read something relay refuses (a credential, a protected path,
    a link leaving the root), or None; bounded by :data:`GREP_SCAN_LIMIT` entries."""
    seen = 0
    for current, dirs, files in os.walk(directory, followlinks=False):
        for entry in [*dirs, *files]:
            seen += 1
            if seen > GREP_SCAN_LIMIT:
                return f"it holds more than {GREP_SCAN_LIMIT} entries"
            path = Path(current) / entry
            resolved = Path(os.path.realpath(path))
            below = protected.below_root(resolved)
            if below is None:
                return f"{path} leads outside the Jupyter root"
            reason = protected.reason(tuple(below), resolved)
            if reason:
                return f"{path} is below it ({reason})"
    return None


# -- the gate binding ---------------------------------------------------------------------------------

@dataclass
class _Gated:
    call_id: str
    name: str
    args: dict[str, Any]
    allowed: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: asyncio.Future[ToolResult] | None = None
    task: asyncio.Task[ToolResult] | None = None


class _ClaudeCodeTools:
    """Claude Code's built-ins as a relay tool source (``core/tooling.ToolSource``), for this run: preflight
    classifies the call; ``tool_call`` runs once the gate allowed it and *waits for the CLI* to run it and
    report its outcome (``PostToolUse``), so the executor journals the intent before and the outcome after."""

    def __init__(self, workspace: Path, jupyter_root: Path | None, protected: Any, read_roots: Any = None,
                 origin: str | None = None) -> None:
        self.workspace, self.jupyter_root, self.protected = workspace, jupyter_root, protected
        self.read_roots, self.origin = read_roots, origin
        # the spec's class is the floor (read): the executor combines it with the preflight's class of each
        # call by core.types.stricter, which only ever raises it, and the preflight always classifies
        self._specs = {n: ToolSpec(name=n, description=f"Claude Code built-in {n}",
                                   input_schema={"type": "object"}, tool_class=ToolClass.READ,
                                   source="claude-code") for n in BUILTIN_TOOLS}

    def spec(self, name: str) -> ToolSpec:
        spec = self._specs.get(name)
        if spec is None:  # unknown to relay (a newer CLI): gated as a write
            spec = self._specs[name] = ToolSpec(name=name[:200], description="Claude Code tool (unclassified)",
                                                input_schema={"type": "object"}, tool_class=ToolClass.READ,
                                                source="claude-code")  # preflight: write
        return spec

    # ToolSource (core/tooling.py), and the older provider names (runtime/tools.py) alike
    def tool_specs(self, ctx: ToolContext) -> Sequence[ToolSpec]:
        return list(self._specs.values())

    specs = tool_specs

    async def tool_current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    current = tool_current

    async def tool_preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        verdict = classify(name, args, self.workspace, jupyter_root=self.jupyter_root, protected=self.protected,
                           read_roots=self.read_roots, origin=self.origin)
        if verdict.tool_class is None:
            raise WorkspaceRefusal(Code.PATH_REFUSED, verdict.refusal)
        return Preflight(reasons=verdict.reasons, preview=verdict.preview, tool_class=verdict.tool_class)

    preflight = tool_preflight

    async def tool_call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                        approved_preview: dict[str, Any]) -> ToolResult:
        gated = _CALL.get()
        if gated is None or gated.name != name or gated.outcome is None:
            return ToolResult("internal: no Claude Code call is waiting for this decision", is_error=True,
                              code=Code.INTERNAL.value)
        gated.allowed.set()  # the hook answers the CLI now; the CLI runs the tool
        return await gated.outcome

    async def call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                   approved_preview: dict[str, Any]) -> ToolResult:
        return await self.tool_call(ctx, name, args, approved_preview)


class _Binding:
    """One decision per ``tool_use_id``, shared by the ``PreToolUse`` hook and ``can_use_tool``."""

    def __init__(self, run: EngineRun, tools: _ClaudeCodeTools) -> None:
        self.run, self.tools = run, tools
        self.index = ToolIndex([tools], run.tool_ctx)
        self.calls: dict[str, _Gated] = {}
        self.announce: Any = None
        """``(tool_use_id, relay's tool name, arguments)`` -> the gateway journals and audits that MCP call under
        the model's id (``broker/gateway_links.py``); None without a gateway."""

    async def decide(self, tool_use_id: str | None, name: str, args: Any) -> tuple[bool, str]:
        if not isinstance(tool_use_id, str) or not tool_use_id:
            return False, "relay: a tool call without an id is refused"
        if not isinstance(args, dict):
            args = {}
        if name.startswith(MCP_PREFIX):
            # relay's own MCP gateway is the gate for these: when the CLI makes the call, the gateway runs it
            # through the one executor (grant, class, pins, consent from this run's kernel, audit) — under the
            # model's tool_use id, announced here just before the CLI sends it
            if self.announce is not None:
                self.announce(tool_use_id, name[len(MCP_PREFIX):], args)
            return True, ""
        if name.startswith("mcp__"):
            return False, "relay: only relay's MCP tools are available to Claude Code"
        gated = self.calls.get(tool_use_id)
        if gated is None:
            self.tools.spec(name)
            gated = self.calls[tool_use_id] = _Gated(tool_use_id, name, args)
            gated.outcome = asyncio.get_running_loop().create_future()
            gated.task = asyncio.create_task(self._gate(gated), name=f"relay-cc-{tool_use_id[:40]}")
        elif gated.name != name or gated.args != args:  # the same id with another call: never reuse a yes
            return False, "relay: this tool call differs from the one relay decided on"
        assert gated.task is not None
        waiter = asyncio.ensure_future(gated.allowed.wait())
        try:
            await asyncio.wait({waiter, gated.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if gated.allowed.is_set():
            return True, ""
        result = gated.task.result()
        return False, f"relay refused this call: {result.content}"

    async def _gate(self, gated: _Gated) -> ToolResult:
        _CALL.set(gated)  # this task's own context: the source's tool_call finds its call
        index = self.index
        if index.get(gated.name) is None:  # a tool relay does not classify (decide() added it): a write
            index = self.index = ToolIndex([self.tools], self.run.tool_ctx)
        size = len(json.dumps(gated.args, default=str).encode())
        return await self.run.executor.run_call(self.run.tool_ctx, index,
                                                ToolCallDone(id=gated.call_id, name=gated.name, input=gated.args,
                                                             raw_size=size))

    def finished(self, tool_use_id: str | None, response: Any, is_error: bool) -> None:
        gated = self.calls.get(tool_use_id or "")
        if gated is None or gated.outcome is None or gated.outcome.done():
            return
        text = response if isinstance(response, str) else json.dumps(response, default=str)
        gated.outcome.set_result(ToolResult(text[:20_000], is_error=is_error))

    async def aclose(self) -> None:
        """Cancel what is still open: the executor journals "cancelled, outcome unknown" for a call the CLI
        had been allowed to run, and a refusal for one still waiting for consent."""
        tasks = [g.task for g in self.calls.values() if g.task is not None and not g.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- the two SDK callbacks ----------------------------------------------------------------------
    async def pre_tool_use(self, hook_input: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        data = hook_input if isinstance(hook_input, dict) else {}
        ok, reason = await self.decide(data.get("tool_use_id") or tool_use_id, str(data.get("tool_name", "")),
                                       data.get("tool_input"))
        if ok:
            return {}  # allowed by relay; the CLI's own checks still apply (they can only say no)
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                       "permissionDecisionReason": reason}}

    async def post_tool_use(self, hook_input: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        data = hook_input if isinstance(hook_input, dict) else {}
        failed = data.get("hook_event_name") == "PostToolUseFailure"
        self.finished(data.get("tool_use_id") or tool_use_id,
                      data.get("error") if failed else data.get("tool_response"), failed)
        return {}

    async def can_use_tool(self, name: str, args: dict[str, Any], context: Any) -> Any:
        from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny

        ok, reason = await self.decide(getattr(context, "tool_use_id", None), name, args)
        return PermissionResultAllow() if ok else PermissionResultDeny(message=reason)


# -- processes ----------------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, session id, state) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return int(fields[1]), int(fields[3]), fields[0]


def session_members(sid: int) -> list[int]:
    """Live processes of session ``sid``, their descendants, and every process of a session one of those
    started (Claude Code runs each ``Bash`` command in a session of its own; a command that puts a child in
    the background leaves it there, re-parented to init, after the shell is gone)."""
    table: dict[int, tuple[int, int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[2] != "Z":
                table[int(entry)] = st
    never = {0, 1, os.getsid(0)}  # never the broker's own session
    sessions = {sid} - never
    members: set[int] = set()
    grew = True
    while grew:
        grew = False
        for pid, (ppid, s, _) in table.items():
            if pid in members:
                continue
            if s in sessions or ppid in members or pid == sid:
                members.add(pid)
                grew = True
                if s not in never and s not in sessions:
                    sessions.add(s)
    members.discard(os.getpid())
    return sorted(members)


def kill_session(sid: int | None) -> int:
    """SIGKILL the CLI's session (the launcher made the CLI a session leader: ``sid`` is its pid), and
    every descendant that left it. Returns how many processes were signalled."""
    if not sid or sid <= 1 or sid == os.getpid() or sid == os.getsid(0):
        return 0
    killed = 0
    for _ in range(3):  # a process forking while we kill: look again
        members = session_members(sid)
        if not members:
            break
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


# -- history across cells -----------------------------------------------------------------------------

_SESSION_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_EARLIER_CHARS = 40_000


def _digest(messages: Sequence[dict[str, Any]]) -> str:
    """A digest of a conversation as stored (role and content of each message; turn numbers aside)."""
    body = [{"role": m.get("role"), "content": m.get("content")} for m in messages]
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


class _Memory:
    """What the broker keeps of one conversation's Claude Code session, so the next ``%%agent`` cell
    continues it (``resume=``): the CLI's ``HOME`` (where Claude Code keeps its session transcripts) and
    ``session.json`` — the session's id and the digest of the relay conversation it holds. It is resumed
    only while the conversation is still exactly that one (a re-run earlier cell forks the conversation;
    a cancelled or failed run leaves its prompt unanswered): otherwise a fresh session gets the earlier
    turns as text. Under the relay data dir (0700), keyed by a digest of the conversation key."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @classmethod
    def of(cls, services: Any, conversation: str) -> _Memory | None:
        base = getattr(services, "state_dir", None)
        if base is None:
            return None
        return cls(Path(base) / hashlib.sha256(conversation.encode()).hexdigest()[:32])

    def home(self) -> Path:
        home = self.dir / "home"
        for d in (self.dir.parent.parent, self.dir.parent, self.dir, home):
            d.mkdir(mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)
        return home

    def resumable(self, prior: Sequence[dict[str, Any]]) -> str | None:
        """The session to resume for a conversation whose stored messages before this prompt are ``prior``."""
        try:
            data = json.loads((self.dir / "session.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        sid = data.get("session_id") if isinstance(data, dict) else None
        if not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid) or data.get("digest") != _digest(prior):
            return None
        return sid

    def remember(self, session_id: str, history: Sequence[dict[str, Any]]) -> None:
        if not _SESSION_ID.fullmatch(session_id):
            return
        self.home()
        tmp = self.dir / "session.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"session_id": session_id, "digest": _digest(history)}, f)
        os.replace(tmp, self.dir / "session.json")


def _earlier(history: Sequence[dict[str, Any]]) -> str:
    """The earlier turns' prompts and answers as text (the last :data:`_EARLIER_CHARS`), for a fresh session."""
    parts = []
    for m in history:
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            continue
        texts = [content] if isinstance(content, str) else [
            str(b.get("text", "")) for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
        joined = "\n".join(t for t in texts if t).strip()
        if joined:
            parts.append(f"[{role}]\n{joined}")
    text = "\n\n".join(parts)[-_EARLIER_CHARS:]
    return text.replace("</earlier-conversation", "</earlier_conversation")


# -- the engine ---------------------------------------------------------------------------------------

def _bundled_cli() -> str | None:
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "_bundled" / "claude"
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


class ClaudeCodeEngine:
    """``claude-code``: see the module docstring. One instance serves every run of the broker."""

    name = "claude-code"

    def __init__(self, services: Any) -> None:
        self.services = services
        self.options = dict(getattr(services, "options", {}) or {})

    # -- RunEngine ------------------------------------------------------------------------------
    def cli_path(self) -> str | None:
        configured = self.options.get("cli_path")
        if configured:
            return str(configured) if os.access(str(configured), os.X_OK) else None
        return _bundled_cli() or shutil.which("claude")

    def check(self, params: Any) -> None:
        if importlib.util.find_spec("claude_agent_sdk") is None:
            raise ConfigRefusal(Code.NO_ENGINE, f"the claude-code engine needs the claude-agent-sdk extra: {INSTALL_HINT}")
        if self.cli_path() is None:
            raise ConfigRefusal(Code.NO_ENGINE, "the claude-code engine found no claude CLI (the claude-agent-sdk "
                                f"wheel bundles one; reinstall it: {INSTALL_HINT}, or set "
                                "c.RelayApp.extra = {'engines': {'claude-code': {'cli_path': ...}}})")
        if getattr(self.services, "workspace_for", None) is None:
            raise ConfigRefusal(Code.NO_ENGINE, "the claude-code engine needs the scratch workspace, which this "
                                "broker does not have (an in-memory broker)")
        login = self.options.get("login", "relay")
        if login not in ("relay", "own"):
            raise ConfigRefusal(Code.CONFIG_INVALID, f"c.RelayApp.extra['engines']['claude-code']['login'] is {login!r}: "
                                "use 'relay' (relay's endpoint and key, the default) or 'own' (your Claude login)")
        profile = getattr(params, "profile", None)
        if login == "own":
            if profile is not None:
                raise ConfigRefusal(Code.CONFIG_INVALID, "--profile sends the engine's model requests through relay's "
                                    "endpoint to that profile; this server runs Claude Code on your own login "
                                    "(login: own), which does not go through relay")
            _own_login(self.options)  # a one-line refusal when the token or the URL is not right
            problem = None
        elif profile is not None:
            problem = None  # the profile's URL and key were checked when the run was asked (run.start)
        else:
            endpoint = getattr(self.services, "model_endpoint", None)
            problem = endpoint.problem() if endpoint is not None else "no model endpoint"
        if problem:
            raise ConfigRefusal(Code.NO_CREDENTIALS, "the claude-code engine sends Claude Code's model requests "
                                f"through relay's Anthropic endpoint: {problem}")
        if not model_allowed(params.model, ("claude-*",)):
            raise ConfigRefusal(Code.MODEL_NOT_ALLOWED, f"model {params.model!r} is not a Claude model "
                                "(the claude-code engine runs Claude models only; use --model claude-...)")

    async def drive(self, run: EngineRun) -> None:
        # the save of the prompt on a store thread (runtime/offload.py; run.start loaded the history)
        history = await run.begin_async() if run.begin_async is not None else run.begin()
        stored = list(history)  # as stored now (the list itself is the run's, and grows with run.add)
        workspace = Path(self.services.workspace_for(run.ctx.conversation))
        stopped: dict[str, str] = {}
        stop = asyncio.Event()

        def on_refusal(code: str, message: str) -> None:
            # a refusal the CLI would retry (a spent budget, a revoked grant): the run ends with it, now
            if code in (Code.BUDGET_EXCEEDED.value, Code.UNAUTHORIZED.value, Code.SCOPE_EXCEEDED.value):
                stopped.setdefault("code", code)
                stopped.setdefault("message", message)
                stop.set()

        memory = _Memory.of(self.services, run.ctx.conversation)
        resume = memory.resumable(stored[:-1]) if memory is not None else None
        sid: int | None = None
        binding = _Binding(run, _ClaudeCodeTools(workspace, self.services.jupyter_root, self.services.protected,
                                                 getattr(self.services, "read_roots", None), run.ctx.origin))
        run_dir = Path(tempfile.mkdtemp(prefix="relay-claude-code-"))
        try:
            async with self._model_session(run, on_refusal) as session, self._mcp_session(run) as mcp:
                if mcp is not None and hasattr(self.services.mcp_gateway, "expect"):
                    binding.announce = lambda tid, tool, args: self.services.mcp_gateway.expect(mcp, tid, tool,
                                                                                                args)
                home = memory.home() if memory is not None else None
                wrapper = self._prepare(run_dir, session, home)
                mcp_config = self._mcp_config(run_dir, mcp)
                options = self._options(run, workspace, wrapper, binding, resume, mcp_config)
                sid_file = run_dir / "pid"
                earlier = "" if resume else _earlier(stored[:-1])
                try:
                    watch = None
                    if isinstance(session, _OwnLogin):
                        # relay cannot refuse these requests one by one: it meters them from the SDK's stream
                        def watch(event: dict[str, Any], meter: _OwnLogin = session) -> None:
                            grant = run.gate.grants.get(run.ctx.origin)  # the live grant: a narrowed cap binds now
                            if grant is None:
                                on_refusal(Code.UNAUTHORIZED.value, f"{run.ctx.origin} has no grant any more")
                                return
                            reason = meter.observe(event, grant.budget.max_tokens_per_run)
                            if reason is not None:
                                on_refusal(Code.BUDGET_EXCEEDED.value, reason)
                    text, session_id, usage = await self._converse(run, options, history, stop, sid_file, earlier,
                                                                   watch)
                    if isinstance(session, _OwnLogin):
                        session.usage = usage
                finally:
                    sid = _read_pid(sid_file)
                    kill_session(sid)  # nothing of the CLI outlives the run (cancel, error or done)
                    await binding.aclose()
            if stopped:
                raise GateRefusal(Code(stopped["code"]), stopped["message"])
            answer = {"role": "assistant", "content": [{"type": "text", "text": text}] if text else []}
            run.add(answer)
            if memory is not None and session_id:
                # the next cell resumes this Claude Code session while the conversation is still this one
                memory.remember(session_id, [*stored, answer] if text else stored)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

    # -- pieces ---------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _model_session(self, run: EngineRun, on_refusal: Any) -> Any:
        """Where the CLI's model requests go: relay's endpoint with a per-run key (the default), or, with
        ``login: own``, the user's own Claude login straight to Anthropic — then the run is reserved in the
        ledger before the CLI starts and settled after with the usage the SDK reports (docs/engines.md)."""
        if self.options.get("login", "relay") != "own":
            async with self.services.model_endpoint.session(run.ctx.origin, run.run_id, on_refusal,
                                                            profile=run.params.profile) as session:
                yield session
            return
        token, base_url = _own_login(self.options)
        grant = run.gate.grants.get(run.ctx.origin)
        cap = grant.budget.max_tokens_per_run if grant is not None else None
        tokens = int(self.options.get("run_reservation_tokens") or cap or OWN_LOGIN_RESERVATION)
        # refused here (no grant, model outside it, a spent day budget): the run ends before the CLI starts
        # on a store thread (runtime/offload.py): a locked budget row stalls this run, not the broker
        reservation = await off_loop_or_undo(lambda r: r.release(), run.gate.begin_completion, run.ctx.origin,
                                             run.params.model, estimated_tokens=tokens, purpose="claude-code-login")
        session = _OwnLogin(token=token, base_url=base_url, reserved=tokens)
        try:
            yield session
        finally:
            if session.usage is not None:
                await off_loop(run.gate.settle_completion, reservation, run.params.model, session.usage)
            else:  # cancelled or failed before a result: the whole reservation, as for a cut request
                await off_loop(run.gate.settle_completion, reservation, run.params.model, None, outcome="cut")

    @contextlib.asynccontextmanager
    async def _mcp_session(self, run: EngineRun) -> Any:
        """relay's gated MCP gateway for this run (None without one), revoked when the run ends."""
        gateway = getattr(self.services, "mcp_gateway", None)
        session = None
        if gateway is not None:
            # the run's caller kind: a run a kernel started is offered that kernel's tools (run_code with its card)
            session = await gateway.session(origin=run.ctx.origin, originator=run.ctx.client_id, run_id=run.run_id,
                                            conversation_key=run.ctx.conversation, mode=run.tool_ctx.mode,
                                            label="claude-code", caller_kind=run.tool_ctx.caller_kind,
                                            allowed=run.params.tools)  # --tools: as the relay engine offers
        try:
            yield session
        finally:
            if session is not None:
                gateway.end(session)

    @staticmethod
    def _mcp_config(run_dir: Path, session: Any) -> Path | None:
        """The CLI's only MCP server — relay's gateway — in a 0600 file (``--mcp-config <file>``: the token
        would be readable by every local user in the CLI's command line)."""
        if session is None:
            return None
        path = run_dir / "mcp.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"mcpServers": {MCP_SERVER: {"type": "http", "url": session.url,
                                                   "headers": {"Authorization": f"Bearer {session.token}"}}}}, f)
        return path

    def _prepare(self, run_dir: Path, session: Any, home: Path | None = None) -> Path:
        """The run directory: TMPDIR of the CLI (and its HOME, unless the conversation keeps one), its
        environment file, the launcher script."""
        os.chmod(run_dir, 0o700)
        tmp = run_dir / "tmp"
        if home is None:
            home = run_dir / "home"
            home.mkdir(mode=0o700)
        tmp.mkdir(mode=0o700)
        runtime = run_dir / "xdg"  # an empty runtime dir of its own: no user bus, no service manager's socket
        runtime.mkdir(mode=0o700)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp), "LANG": "C.UTF-8",
            "TERM": "dumb", "SHELL": "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh",
            "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            # a Bash command's `systemd-run --user`, `busctl --user`, `dbus-send --session` would hand a process to
            # the user's service manager, outside the launcher's tree (never killed at the run's end): both point at
            # nothing, so they fail instead of falling back to /run/user/<uid> or autolaunching (docs/engines.md)
            "XDG_RUNTIME_DIR": str(runtime), "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime / 'no-bus'}",
        }
        if isinstance(session, _OwnLogin):  # the user's own login: no key of relay's, no relay endpoint
            env["CLAUDE_CODE_OAUTH_TOKEN"] = session.token
            if session.base_url:
                env["ANTHROPIC_BASE_URL"] = session.base_url
        else:
            env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"] = session.base_url, session.key
        fd = os.open(run_dir / "env.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(env, f)
        launcher = Path(__file__).with_name("claude_launch.py")
        cli = self.cli_path()
        wrapper = run_dir / "claude"
        fd = os.open(wrapper, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\n" f"exec {_sh(sys.executable)} -I -S {_sh(str(launcher))} {_sh(str(run_dir))} "
                    f"{_sh(str(cli))} \"$@\"\n")
        return wrapper

    def _options(self, run: EngineRun, workspace: Path, wrapper: Path, binding: _Binding,
                 resume: str | None = None, mcp_config: Path | None = None) -> Any:
        from claude_agent_sdk import ClaudeAgentOptions, HookMatcher

        # a hook waits for the consent card: its timeout must outlast the card's
        wait = float(self.options.get("hook_timeout", 3600))
        return ClaudeAgentOptions(
            tools=list(BUILTIN_TOOLS), allowed_tools=[], permission_mode="default",
            can_use_tool=binding.can_use_tool,
            hooks={"PreToolUse": [HookMatcher(matcher=None, hooks=[binding.pre_tool_use], timeout=wait)],
                   "PostToolUse": [HookMatcher(matcher=None, hooks=[binding.post_tool_use])],
                   "PostToolUseFailure": [HookMatcher(matcher=None, hooks=[binding.post_tool_use])]},
            cwd=str(workspace), cli_path=str(wrapper), model=run.params.model, max_turns=run.config.max_steps,
            mcp_servers=str(mcp_config) if mcp_config is not None else {}, strict_mcp_config=True,
            setting_sources=[], include_partial_messages=True,
            system_prompt={"type": "preset", "preset": "claude_code", "append": SYSTEM_APPEND},
            resume=resume, env={}, stderr=_stderr_logger(run.run_id))

    async def _converse(self, run: EngineRun, options: Any, history: list[dict[str, Any]],
                        stop: asyncio.Event, sid_file: Path, earlier: str = "",
                        watch: Any = None) -> tuple[str, str | None, Usage | None]:
        from claude_agent_sdk import ClaudeSDKClient
        from claude_agent_sdk import ResultMessage, StreamEvent, AssistantMessage, TextBlock

        parts: list[str] = []
        streamed = {"any": False}
        coalescer = Coalescer(run.text, interval=run.config.coalesce_interval, max_chars=run.config.coalesce_chars)
        result: Any = None

        async def consume(client: Any) -> None:
            nonlocal result
            async for message in client.receive_response():
                if isinstance(message, StreamEvent):
                    event = message.event or {}
                    kind = event.get("type")
                    if watch is not None:
                        watch(event)  # every request's usage, a sub-agent's too
                    if kind == "message_start" and message.parent_tool_use_id is None:
                        run.step()  # each model request is a step (max_steps; the gate charges it)
                    elif kind == "content_block_start" and message.parent_tool_use_id is None:
                        block = event.get("content_block") or {}
                        if block.get("type") == "text" and streamed["any"]:
                            coalescer.add("\n\n")  # between two texts of the answer, as in the history
                    elif kind == "content_block_delta" and message.parent_tool_use_id is None:
                        delta = event.get("delta") or {}
                        if delta.get("type") == "text_delta" and delta.get("text"):
                            coalescer.add(str(delta["text"]))
                            streamed["any"] = True
                elif isinstance(message, AssistantMessage) and message.parent_tool_use_id is None:
                    texts = [b.text for b in message.content if isinstance(b, TextBlock) and b.text]
                    parts.extend(texts)
                elif isinstance(message, ResultMessage):
                    result = message

        client = ClaudeSDKClient(options)
        try:
            await client.connect()
            await client.query(_prompt(run, history, earlier))
            consumer = asyncio.ensure_future(consume(client))
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({consumer, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
                if not consumer.done():
                    consumer.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await consumer
            if consumer.done() and not consumer.cancelled() and consumer.exception() is not None:
                raise consumer.exception()  # type: ignore[misc]
        except asyncio.CancelledError:
            kill_session(_read_pid(sid_file))  # first: the SDK's own close may not run its escalation
            raise
        finally:
            coalescer.close()
            kill_session(_read_pid(sid_file))
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(client.disconnect()), timeout=10)
        if stop.is_set():
            return "".join(parts), None, None
        if result is None:
            raise Refusal(Code.BACKEND_ERROR, "Claude Code ended without a result (see the broker log)")
        usage = _usage(run, result)
        if result.subtype == "error_max_turns":
            raise GateRefusal(Code.BUDGET_EXCEEDED, f"step limit of {run.config.max_steps} per run reached",
                              data={"limit": "max_steps"})
        if result.is_error:
            detail = "; ".join(str(e) for e in (result.errors or [])) or str(result.result or result.subtype)
            raise Refusal(Code.BACKEND_ERROR, f"Claude Code failed: {detail[:500]}")
        session_id = getattr(result, "session_id", None)
        return "\n\n".join(parts), session_id if isinstance(session_id, str) and session_id else None, usage


def _prompt(run: EngineRun, history: list[dict[str, Any]], earlier: str = "") -> str:
    """The prompt of this run, with its attachments (untrusted data, labelled as such), after the text of
    the conversation's earlier turns when Claude Code cannot resume them (``earlier``)."""
    text = run.params.prompt
    if earlier:
        text = (f"<earlier-conversation note=\"the earlier turns of this conversation, as text\">\n{earlier}\n"
                f"</earlier-conversation>\n\n{text}")
    for a in run.params.attachments or ():
        label = str(a.get("label", "attachment"))[:200]
        text += f"\n\n<untrusted-data label={json.dumps(label)}>\n{a.get('content', '')}\n</untrusted-data>"
    return text


def _usage(run: EngineRun, result: Any) -> Usage | None:
    u = result.usage or {}
    try:
        usage: Usage | None = Usage(
            input_tokens=int(u.get("input_tokens") or 0), output_tokens=int(u.get("output_tokens") or 0),
            cache_creation_input_tokens=int(u.get("cache_creation_input_tokens") or 0),
            cache_read_input_tokens=int(u.get("cache_read_input_tokens") or 0))
        data = usage.model_dump() if usage is not None else {}
    except Exception:
        usage, data = None, {}
    # charged per request by the gate at relay's endpoint; this is the engine's own total, for the cell
    run.emit(EventType.USAGE, {**data, "basis": "proxy", "cost_usd": round(float(result.total_cost_usd or 0.0), 6)})
    return usage


#: Tokens reserved for a whole run on the user's own login when the grant sets no ``max_tokens_per_run``.
OWN_LOGIN_RESERVATION = 100_000
#: The least output a next request of the user's own login must have room for (as relay's endpoint fits an
#: engine's request: ``broker/anthropic_proxy.MIN_FITTED_OUTPUT``, which an engine may not import).
MIN_NEXT_OUTPUT = 1024
_OWN_HINT = ("run `claude setup-token`, save the token in a file only you can read (chmod 600) and name it in "
             "c.RelayApp.extra = {'engines': {'claude-code': {'login': 'own', 'oauth_token_file': PATH}}}")


@dataclass
class _OwnLogin:
    """The user's own Claude login for one run (``login: own``): the token and an optional base URL, and the run's
    token meter. relay does not see these requests, so :meth:`observe` reads each one's usage from the SDK's
    stream (``message_start``, the cumulative ``message_delta``) and counts it into the run; once the next request
    would pass the run's cap — it resends the whole conversation, so it is at least as large as the last one —
    the run is stopped before the CLI sends it."""

    token: str = field(repr=False)
    base_url: str | None = None
    usage: Usage | None = None
    reserved: int | None = None
    """The tokens reserved for the run in the day budget: the run may not count more."""
    counted: int = 0
    """Tokens of the run's finished requests, as the stream reported them."""
    _in: int = 0
    _out: int = 0
    _streamed: int = 0
    """UTF-8 bytes of the current request's streamed answer: an upper bound of its output tokens so far."""
    _stop_reason: str | None = None

    def cap(self, grant_cap: int | None) -> int | None:
        caps = [c for c in (self.reserved, grant_cap) if c is not None]
        return min(caps) if caps else None

    def observe(self, event: dict[str, Any], grant_cap: int | None) -> str | None:
        """Count one stream event; the one-line reason when the run must stop now, else None.

        Three checks (docs/engines.md "Your own Claude login"): after a request that asked for tools, the next
        one — which resends all of it — must leave room for :data:`MIN_NEXT_OUTPUT` output tokens, or the run
        stops before the CLI sends it; at a request's ``message_start`` (its input now known) the same room must be
        left, or it is stopped there; while it streams, its output is counted at one token per UTF-8 byte (a
        token is at least one byte: never less than the truth), and the run stops once that passes the cap."""
        kind = event.get("type")
        cap = self.cap(grant_cap)
        if kind == "message_start":
            self._in, self._out, self._stop_reason, self._streamed = 0, 0, None, 0
            self._merge((event.get("message") or {}).get("usage"))
            if cap is not None and self.counted + self._in + MIN_NEXT_OUTPUT > cap:
                # a request that cannot fit got out (its tool results made it larger than the last): stop it now
                return (f"token limit of {cap} per run reached ({self.counted} used, {self._in} more asked by "
                        "the next request)")
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            for key in ("text", "partial_json", "thinking"):
                piece = delta.get(key)
                if isinstance(piece, str):
                    self._streamed += len(piece.encode("utf-8", "replace"))
            if cap is not None and self.counted + self._in + max(self._out, self._streamed) > cap:
                return (f"token limit of {cap} per run reached ({self.counted} used, {self._in} more in this "
                        f"request's input, its answer stopped at about {self._streamed} bytes)")
        elif kind == "message_delta":
            self._merge(event.get("usage"))
            self._stop_reason = (event.get("delta") or {}).get("stop_reason") or self._stop_reason
        elif kind == "message_stop":
            last = self._in + self._out
            self.counted += last
            self._in = self._out = self._streamed = 0
            # the model asked for tools: the CLI's next request resends all of this one, and more, and needs room
            # for an answer
            if cap is not None and self._stop_reason == "tool_use" and self.counted + last + MIN_NEXT_OUTPUT > cap:
                return (f"token limit of {cap} per run reached ({self.counted} used, at least "
                        f"{last + MIN_NEXT_OUTPUT} more for the next request)")
        return None

    def _merge(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        fields = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        if any(isinstance(usage.get(k), int) for k in fields):
            self._in = sum(max(0, int(usage.get(k) or 0)) for k in fields)
        out = usage.get("output_tokens")
        if isinstance(out, int) and not isinstance(out, bool):
            self._out = max(0, out)


def _own_login(options: Any) -> tuple[str, str | None]:
    """The token of ``oauth_token_file`` (a regular 0600 file of this user) and the checked base URL.

    Raises:
        ConfigRefusal: ``NO_CREDENTIALS`` / ``CONFIG_INVALID``, one line saying how to fix it.
    """
    import stat

    path = options.get("oauth_token_file")
    if not path:
        raise ConfigRefusal(Code.NO_CREDENTIALS, f"the claude-code engine's own login needs a token: {_OWN_HINT}")
    try:
        st = os.stat(str(path))
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or st.st_uid != os.getuid():
            raise ConfigRefusal(Code.NO_CREDENTIALS, f"{path} must be a regular file of yours that only you can "
                                f"read (chmod 600): {_OWN_HINT}")
        token = Path(str(path)).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigRefusal(Code.NO_CREDENTIALS, f"cannot read {path} ({exc.strerror}): {_OWN_HINT}") from None
    if not token or len(token) > 4096 or any(c.isspace() or ord(c) < 32 for c in token):
        raise ConfigRefusal(Code.NO_CREDENTIALS, f"{path} holds no token: {_OWN_HINT}")
    base_url = options.get("anthropic_base_url") or None
    if base_url is not None:
        from ..mcp.policy import check_model_endpoint

        base_url = check_model_endpoint(str(base_url), "c.RelayApp.extra['engines']['claude-code']"
                                                       "['anthropic_base_url']")
    return token, base_url


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _sh(value: str) -> str:
    import shlex

    return shlex.quote(value)


def _stderr_logger(run_id: str) -> Any:
    from ..core.redact import mask_secret_text

    count = {"n": 0}

    def write(line: str) -> None:
        if count["n"] < 200:  # bounded: a chatty CLI must not flood the broker log
            count["n"] += 1
            log.debug("claude-code %s: %s", run_id, mask_secret_text(line[:500]))

    return write
