"""Real test doubles, shipped so users can test their notebooks too.

- :class:`FakeAnthropic`: an Anthropic Messages API server on 127.0.0.1 (streaming and not).
- :class:`FakeOpenAI`: an OpenAI-compatible ``/v1/chat/completions`` server.
- :mod:`relay_jupyter.testing.mcp_server`: a test MCP server (stdio, Streamable HTTP, in-process).
- pytest fixtures ``fake_anthropic``, ``fake_openai``, ``relay_data_dir`` (installed as a pytest plugin).

Replies are scripted with :class:`Reply`, :func:`text` and :func:`tool_use`; see ``docs/testing.md``.
"""

from .fake_anthropic import FakeAnthropic
from .fake_openai import FakeOpenAI
from .loopback import RecordedRequest
from .script import ErrorReply, Reply, TextBlock, ToolUseBlock, Usage, text, tool_use

__all__ = [
    "ErrorReply",
    "FakeAnthropic",
    "FakeOpenAI",
    "RecordedRequest",
    "Reply",
    "TextBlock",
    "ToolUseBlock",
    "Usage",
    "text",
    "tool_use",
]
