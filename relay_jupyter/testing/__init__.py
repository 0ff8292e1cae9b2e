"""Real test doubles, shipped so users can test their notebooks too.

- :class:`FakeAnthropic`: an Anthropic Messages API server on 127.0.0.1 (streaming and not).
- :class:`FakeOpenAI`: an OpenAI-compatible ``/v1/chat/completions`` server.
- :class:`FaultModelServer`: a misbehaving model server (both protocols): stalls with pings,
  trickles, truncates, floods one line, sends malformed or error events, cuts, reports absurd usage.
- :mod:`relay_jupyter.testing.mcp_server`: a test MCP server (stdio, Streamable HTTP, in-process).
- pytest fixtures ``fake_anthropic``, ``fake_openai``, ``mcp_http_server``, ``relay_data_dir``
  (installed as a pytest plugin).

Replies are scripted with :class:`Reply`, :func:`text` and :func:`tool_use`; see ``docs/testing.md``.

Names are imported on first use: the pytest plugin lives in this package and is loaded by every
pytest session, which should not pay for the fakes (and pydantic) unless a test uses them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ErrorReply",
    "FakeAnthropic",
    "FakeOpenAI",
    "FaultModelServer",
    "RecordedRequest",
    "Reply",
    "TextBlock",
    "ThinkingBlock",
    "ToolUseBlock",
    "Usage",
    "text",
    "thinking",
    "tool_use",
]

_WHERE = {
    "FakeAnthropic": "fake_anthropic",
    "FakeOpenAI": "fake_openai",
    "FaultModelServer": "fault_model_server",
    "RecordedRequest": "loopback",
    "ErrorReply": "script",
    "Reply": "script",
    "TextBlock": "script",
    "ThinkingBlock": "script",
    "thinking": "script",
    "ToolUseBlock": "script",
    "Usage": "script",
    "text": "script",
    "tool_use": "script",
}

if TYPE_CHECKING:
    from .fake_anthropic import FakeAnthropic
    from .fake_openai import FakeOpenAI
    from .fault_model_server import FaultModelServer
    from .loopback import RecordedRequest
    from .script import (
        ErrorReply,
        Reply,
        TextBlock,
        ThinkingBlock,
        ToolUseBlock,
        Usage,
        text,
        thinking,
        tool_use,
    )


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
