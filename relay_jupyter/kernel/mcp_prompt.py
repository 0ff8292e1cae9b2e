"""``%agent --prompt server:name [--arg NAME=VALUE ...]``: an MCP server's prompt as the run's request.

The broker fetches the prompt (RPC ``mcp.prompt_get``: only from a server the notebook's grant reaches,
audited with the argument names; docs/mcp.md "Prompts"); the kernel shows in the cell, before the run
starts, that the request is that server's text — not the user's, not relay's — and then runs it like a
typed request. Text in the cell body (or on the magic line) is added after the prompt's text.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, cast

from ..core.errors import RelayError
from ..protocol import kernel_wire as wire
from ..protocol.names import Method
from .consent import detect_surface
from .errors import AgentUsageError, as_agent_error
from .rendering import visible
from .session import RunOptions

__all__ = ["PromptRef", "PromptRunOptions", "parse_prompt_ref", "resolve_prompt"]

_SERVER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
#: The prompt as shown in the cell: this many characters, then a note of how much more the run gets.
SHOWN_CHARS = 4000


@dataclass(frozen=True)
class PromptRef:
    server: str
    name: str
    arguments: dict[str, str] = field(default_factory=dict)


@dataclass
class PromptRunOptions(RunOptions):
    """:class:`RunOptions` whose request is (or starts with) an MCP prompt, fetched when the cell runs."""

    mcp_prompt: PromptRef | None = None


def parse_prompt_ref(ref: str, args: list[str]) -> PromptRef:
    """``server:name`` and ``NAME=VALUE`` words as a :class:`PromptRef`.

    Raises:
        AgentUsageError: one line saying what is wrong.
    """
    server, sep, name = ref.partition(":")
    if not sep or not _SERVER.match(server) or not name or len(name) > 200 or not name.isprintable():
        raise AgentUsageError(f"%%agent: --prompt {ref[:80]!r} is not server:name (an MCP server of mcp.json and "
                              "one of its prompts; relay.prompts() lists them)")
    arguments: dict[str, str] = {}
    for word in args:
        key, eq, value = word.partition("=")
        if not eq or not key or len(key) > 100:
            raise AgentUsageError(f"%%agent: --arg {word[:60]!r} is not NAME=VALUE")
        if key in arguments:
            raise AgentUsageError(f"%%agent: --arg {key!r} is given twice")
        arguments[key] = value
    if len(arguments) > 32:
        raise AgentUsageError("%%agent: at most 32 --arg values")
    return PromptRef(server, name, arguments)


async def resolve_prompt(session: Any, opts: RunOptions) -> RunOptions:
    """Fetch the prompt of ``opts`` (when it names one), show where the request comes from, and return the
    options with the prompt's text (plus the cell's own text) as the request.

    Raises:
        AgentError: the broker refused (no such server or prompt, the grant reaches none of its tools, an
            argument missing or unknown, the server unreachable), in one line.
    """
    ref = getattr(opts, "mcp_prompt", None)
    if ref is None:
        return opts
    try:
        await session.ensure_grant(detect_surface(session.shell, session.policy.surface), opts)
        client = await session.get_client()
        params: wire.McpPromptGetParams = {"server": ref.server, "name": ref.name, "arguments": dict(ref.arguments)}
        got = cast(wire.McpPromptGetResult, await client.call(Method.MCP_PROMPT_GET, params))
    except RelayError as exc:
        error = as_agent_error(exc)
        if error is exc:
            raise
        raise error from None
    text = str(got.get("text") or "")
    if not text.strip():
        raise AgentUsageError(f"%%agent: the prompt {ref.server}:{ref.name} is empty")
    extra = opts.prompt.strip()
    shown = visible(text[:SHOWN_CHARS])
    more = f"\n│ … ({len(text) - SHOWN_CHARS} more characters go to the model)" if len(text) > SHOWN_CHARS else ""
    cut = " (the server's prompt was cut at relay's output bound)" if got.get("truncated") else ""
    body = "\n".join("│ " + line for line in shown.splitlines() or [""])
    print(f"↳ request from the MCP server {visible(ref.server, newlines=False)}'s prompt "
          f"{visible(ref.name, newlines=False)} (its text, not relay's){cut}:\n{body}{more}"
          + ("\n↳ followed by this cell's text" if extra else ""), flush=True)
    return dataclasses.replace(opts, prompt=text + ("\n\n" + extra if extra else ""))


def prompt_rows(listed: dict[str, Any]) -> list[dict[str, Any]]:
    """``mcp.prompts_list``'s answer as table rows (``relay.prompts()``)."""
    rows = [{"prompt": f"{p.get('server')}:{p.get('name')}", "description": p.get("description", ""),
             "arguments": ", ".join(f"{a.get('name')}{'' if a.get('required') else '?'}"
                                    for a in p.get("arguments") or [])}
            for p in (listed or {}).get("prompts", [])]
    for server, message in ((listed or {}).get("problems") or {}).items():
        rows.append({"prompt": f"{server}:", "description": f"(not listed: {message})", "arguments": ""})
    return rows
