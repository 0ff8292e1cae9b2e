"""``%%agent`` and ``%agent``: parse the line, run the agent, fail the cell with one line on error.

Syntax::

    %%agent [--model M] [--backend anthropic|openai|demo] [--engine relay|claude-code] [--profile NAME]
            [--chat NAME] [--new] [--mode ask|review|full]
            [--max-tokens N] [--tools a,b | --no-tools] [--var NAME ...] [--bg]
            [--prompt SERVER:NAME [--arg NAME=VALUE ...]]
    <prompt>

    %agent [options] <prompt on the same line>

The input transformer (``transformer.py``) rewrites such a cell into ``await _run_cell(line, body)``
so the kernel keeps handling widget clicks while the cell waits (ipykernel >= 7.4). Configure with
``%config AgentMagics.<trait> = ...`` or an IPython profile.

``--prompt server:name`` takes the request from an MCP server's prompt (``kernel/mcp_prompt.py``; the cell's
own text, if any, is added after it).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shlex
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from traitlets import Bool, Enum, Float, List, Unicode

from ..protocol.run_choices import BACKEND_NAMES, ENGINE_NAMES, PROFILE_NAME_PATTERN
from .consent import SURFACES, ConsentPolicy
from .conversations import valid_chat_name
from .errors import AgentError, AgentUsageError
from .mcp_prompt import PromptRunOptions, parse_prompt_ref, resolve_prompt
from .session import RunOptions, Session

__all__ = ["USAGE", "AgentMagics", "parse_line", "run_cell_async"]

USAGE = (f"usage: %%agent [--model M] [--backend {'|'.join(BACKEND_NAMES)}] [--engine {'|'.join(ENGINE_NAMES)}] [--profile NAME] [--chat NAME] [--new] [--mode ask|review|full] "
         "[--max-tokens N] [--tools a,b | --no-tools] [--var NAME ...] [--bg] [--prompt SERVER:NAME [--arg NAME=VALUE ...]]")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse would print usage and SystemExit; a magic user gets one line instead
        raise AgentUsageError(f"%%agent: {message} ({USAGE.removeprefix('usage: ')})")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        raise AgentUsageError(message.strip() if message else USAGE)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0 or value > 128_000:  # the broker's run.start bound
        raise argparse.ArgumentTypeError(f"must be between 1 and 128000: {text!r}")
    return value


def _build_parser() -> _Parser:
    parser = _Parser(prog="%%agent", add_help=False, allow_abbrev=False)
    parser.add_argument("--model")
    parser.add_argument("--backend", choices=BACKEND_NAMES)
    parser.add_argument("--engine", choices=ENGINE_NAMES)
    parser.add_argument("--profile")
    parser.add_argument("--chat", default="default")
    parser.add_argument("--new", action="store_true")
    parser.add_argument("--mode", choices=("ask", "review", "full"))
    parser.add_argument("--max-tokens", type=_positive_int, dest="max_tokens")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--tools")
    group.add_argument("--no-tools", action="store_true", dest="no_tools")
    parser.add_argument("--var", action="append", nargs="+", default=[])
    parser.add_argument("--bg", action="store_true")
    parser.add_argument("--prompt", dest="mcp_prompt")
    parser.add_argument("--arg", action="append", default=[], dest="prompt_args")
    parser.add_argument("prompt", nargs="*")
    return parser


def parse_line(line: str, body: str = "", *, cell_id: str | None = None) -> RunOptions:
    """The magic line (and cell body) as :class:`RunOptions`.

    Raises:
        AgentUsageError: one line saying what is wrong.
    """
    if len(line) > 10_000:
        raise AgentUsageError("%%agent: the option line is too long")
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise AgentUsageError(f"%%agent: cannot parse the line ({exc})") from None
    args = _build_parser().parse_args(words)
    prompt = body.strip() if body.strip() else " ".join(args.prompt)
    if body.strip() and args.prompt:
        raise AgentUsageError(f"%%agent: unexpected text on the magic line: {' '.join(args.prompt)!r} "
                              "(put the prompt in the cell body)")
    if args.prompt_args and args.mcp_prompt is None:
        raise AgentUsageError("%%agent: --arg is for an MCP prompt's arguments: give --prompt SERVER:NAME too")
    ref = parse_prompt_ref(args.mcp_prompt, args.prompt_args) if args.mcp_prompt is not None else None
    if not prompt.strip() and ref is None:
        raise AgentUsageError("%%agent: the prompt is empty (write it in the cell body)")
    if not valid_chat_name(args.chat):
        raise AgentUsageError(f"%%agent: --chat {args.chat!r} is not a valid name (letters, digits, . _ -)")
    tools: list[str] | None = None
    if args.no_tools:
        tools = []
    elif args.tools is not None:
        tools = [t.strip() for t in args.tools.split(",") if t.strip()]
        if not tools:
            raise AgentUsageError("%%agent: --tools needs at least one tool name (or use --no-tools)")
    variables = [name.strip() for group in args.var for item in group for name in item.split(",") if name.strip()]
    for name in variables:
        if not name.isidentifier():
            raise AgentUsageError(f"%%agent: --var {name!r} is not a variable name")
    if args.model is not None and not args.model.strip():
        raise AgentUsageError("%%agent: --model is empty")
    if args.profile is not None and not re.match(PROFILE_NAME_PATTERN, args.profile):
        raise AgentUsageError(f"%%agent: --profile {args.profile[:40]!r} is not a profile name (1-32 of letters, "
                              "digits, _ -; see `jupyter relay profiles list`)")
    options = PromptRunOptions if ref is not None else RunOptions
    extra = {"mcp_prompt": ref} if ref is not None else {}
    return options(prompt=prompt, model=args.model, backend=args.backend, engine=args.engine,
                      profile=args.profile, chat=args.chat,
                      new=args.new,
                      mode=args.mode, max_tokens=args.max_tokens, tools=tools, variables=variables,
                      background=args.bg, cell_id=cell_id, **extra)


@magics_class
class AgentMagics(Magics):
    """The ``agent`` magics and their configuration."""

    default_model = Unicode("", help="Model used when a cell gives no --model ('' = the broker's default).").tag(
        config=True)
    default_backend = Unicode("", help="Backend used when a cell gives no --backend ('' = the broker's).").tag(
        config=True)
    consent_ui = Enum(list(SURFACES), default_value="auto",
                      help="Who answers permission requests: auto-detect, widget cards, input() or the headless "
                           "policy.").tag(config=True)
    headless_policy = Enum(["deny", "allowlist"], default_value="deny",
                           help="Headless (nbclient/nbval/CI): deny every write, or allow the tools in "
                                "headless_allowlist.").tag(config=True)
    headless_allowlist = List(Unicode(), default_value=[],
                              help="Tool names a headless run may use without a human.").tag(config=True)
    consent_timeout = Float(300.0, min=1.0, help="Seconds to wait for a click before denying.").tag(config=True)
    update_interval = Float(0.1, min=0.02, help="Minimum seconds between live output updates.").tag(config=True)
    start_daemon = Bool(True, help="Start `jupyter relay serve` on a Unix socket when no broker is found.").tag(
        config=True)
    prewarm = Bool(True, help="At %load_ext, connect to an already running broker in the background (grant "
                              "check, event stream) so the first cell starts sooner. Never starts a daemon; "
                              "set in a profile (it acts at load).").tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.current_cell_id: str | None = None
        self.session = self._new_session()
        self.observe(lambda _change: self._reconfigure(), names=[
            "default_model", "default_backend", "consent_ui", "headless_policy", "headless_allowlist",
            "consent_timeout", "update_interval", "start_daemon"])

    def _policy(self) -> ConsentPolicy:
        import os

        allow = set(self.headless_allowlist)
        policy = self.headless_policy
        env = os.environ.get("RELAY_HEADLESS_ALLOW", "").strip()
        if env:  # a CI job can opt tools in without a profile
            allow |= {t.strip() for t in env.split(",") if t.strip()}
            policy = "allowlist"
        return ConsentPolicy(surface=self.consent_ui, headless_policy=policy, allowlist=frozenset(allow),
                             timeout=self.consent_timeout)

    def _new_session(self) -> Session:
        return Session(self.shell, policy=self._policy(), default_model=self.default_model or None,
                       default_backend=self.default_backend or None, update_interval=self.update_interval,
                       start_daemon=self.start_daemon)

    def _reconfigure(self) -> None:
        self.session.policy = self._policy()
        self.session.default_model = self.default_model or None
        self.session.default_backend = self.default_backend or None
        self.session.update_interval = self.update_interval
        self.session.start_daemon = self.start_daemon

    async def run(self, line: str, body: str) -> None:
        """Parse and run one cell; ``--bg`` returns at once and keeps writing into this cell's output."""
        opts = parse_line(line, body, cell_id=self.current_cell_id)
        opts = await resolve_prompt(self.session, opts)  # --prompt server:name: the prompt's text (shown) as the request
        if opts.background:
            task = asyncio.ensure_future(self._background(opts))
            self.session.runs[str(id(task))] = task
            task.add_done_callback(lambda t: self.session.runs.pop(str(id(t)), None))
            return
        await self.session.run(opts)
        return

    async def _background(self, opts: RunOptions) -> None:
        # ipykernel keeps the parent message in a context variable copied into this task, so output
        # keeps landing in the cell that started it
        try:
            await self.session.run(opts)
        except AgentError as exc:
            print(exc._render_traceback_()[0])

    @line_cell_magic
    def agent(self, line: str, cell: str | None = None) -> Any:
        """Run the relay agent (see ``%%agent?``). Normally rewritten into a top-level ``await``."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            return asyncio.run(self.run(line, cell or ""))
        # called directly (run_cell_magic) inside a running loop: cannot block on it, so run in the background
        return loop.create_task(self.run(line + " --bg", cell or ""))


def _magics(shell: Any) -> AgentMagics:
    magics = shell.magics_manager.registry.get("AgentMagics") if shell is not None else None
    if magics is None:
        raise AgentError("the relay extension is not loaded: run %load_ext relay_jupyter")
    return magics


async def run_cell_async(line: str, body: str = "") -> None:
    """What a rewritten ``%%agent`` cell awaits."""
    from IPython import get_ipython

    await _magics(get_ipython()).run(line, body)
