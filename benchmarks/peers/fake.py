"""The one paced answer every variant gets, served by the fake Anthropic server of ``relay_jupyter.testing``.

A streamed request gets the answer as the real API would send it: the first text delta after
``FIRST_TOKEN_DELAY``, then ``TOKENS_PER_SECOND``. A non-streamed request (what the jupyter-ai magics
send) is held for the time the stream would take to finish before the whole message is sent: the
real API also generates every token before it answers a non-streamed request. Without this hold the
fake would answer a non-streaming client instantly and flatter it.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from relay_jupyter.testing import FakeAnthropic, Reply
from relay_jupyter.testing.script import count_tokens

__all__ = [
    "ANSWER",
    "ANSWER_TOKENS",
    "FIRST_TOKEN_DELAY",
    "MARKER",
    "MODEL",
    "PROMPT",
    "TOKENS_PER_SECOND",
    "V2_MODEL",
    "PacedFake",
    "answer_reply",
]

MODEL = "claude-haiku-4-5"
"""The model id of the SDK, ``%%agent`` and jupyter-ai 3.x cells (3.x accepts only ids litellm lists)."""
V2_MODEL = "claude-3-5-haiku-20241022"
"""jupyter-ai 2.x's provider lists older ids only. The fake answers every id the same way."""
API_KEY = "sk-ant-bench-not-a-real-key"
PROMPT = "Explain what a Jupyter kernel is, in about 600 words."
FIRST_TOKEN_DELAY = 0.1
TOKENS_PER_SECOND = 100.0
ANSWER_TOKENS = 600
PARAGRAPH_WORDS = 60
MARKER = "Zyxwvut"
"""The first word of the answer: the first output message containing it is "first text visible"
(a placeholder such as a spinner does not count)."""

_WORDS = ("kernels", "run", "code", "for", "a", "notebook", "and", "send", "results", "back", "over",
          "messages", "while", "the", "frontend", "renders", "them", "as", "cells", "execute")


def _answer_text(tokens: int) -> str:
    # one token per word (the fake counts `\S+\s*` pieces); plain words, so no renderer escapes anything;
    # paragraphs of 60 words, as a real answer of this length has (a renderer may treat a finished
    # paragraph differently from the one still growing)
    words = [MARKER] + [_WORDS[i % len(_WORDS)] for i in range(tokens - 1)]
    paragraphs = [" ".join(words[i:i + PARAGRAPH_WORDS]) + "." for i in range(0, len(words), PARAGRAPH_WORDS)]
    return "\n\n".join(paragraphs) + "\n"


ANSWER = _answer_text(ANSWER_TOKENS)
assert count_tokens(ANSWER) == ANSWER_TOKENS, count_tokens(ANSWER)


def answer_reply() -> Reply:
    """The paced reply: 600 tokens, first at 0.1 s, then 100 tokens/s."""
    return Reply(ANSWER, first_token_delay=FIRST_TOKEN_DELAY, tokens_per_second=TOKENS_PER_SECOND)


def short_reply() -> Reply:
    """A two-word answer (first token at 0.1 s): the second cell of a kernel, to time the per-cell
    overhead without another 6 s answer."""
    return Reply(f"{MARKER} again.", first_token_delay=FIRST_TOKEN_DELAY, tokens_per_second=TOKENS_PER_SECOND)


def stream_duration(reply: Reply) -> float:
    """Seconds from request to the last delta of ``reply`` when streamed (the Pacer's schedule: the
    first delta after the delay, each later one once every token before it had its share of time)."""
    text = "".join(b.text for b in reply.blocks if hasattr(b, "text"))
    from relay_jupyter.testing.script import split_text

    chunks = split_text(text, reply.chunk_tokens)
    before_last = sum(count_tokens(c) or 1 for c in chunks[:-1])
    rate = reply.tokens_per_second
    return reply.first_token_delay + (before_last / rate if rate else 0.0)


class PacedFake(FakeAnthropic):
    """:class:`FakeAnthropic` answering every request with :func:`answer_reply`, or with the replies
    queued by :meth:`queue_next`; non-streamed requests are held for the stream's duration first (see
    the module docstring)."""

    def __init__(self) -> None:
        super().__init__(api_key=API_KEY, default=answer_reply(), models=(MODEL,))
        self._next: collections.deque[Reply] = collections.deque()

    def queue_next(self, reply: Reply) -> None:
        """Answer the next model request with ``reply`` (then the default again)."""
        self._next.append(reply)

    async def handle(self, request: Any, record: Any, responder: Any) -> None:
        """Pick the reply, hold a non-streamed ``/v1/messages`` request, then answer as the fake does."""
        body = record.body
        if request.method == "POST" and request.path.split("?")[0].rstrip("/") == "/v1/messages":
            reply = self._next.popleft() if self._next else answer_reply()
            if isinstance(body, dict) and not body.get("stream"):
                await asyncio.sleep(stream_duration(reply))
            self.script.push(reply)
            try:
                await super().handle(request, record, responder)
            finally:
                self.script.clear()  # a request refused before it took its reply must not shift the next
            return
        await super().handle(request, record, responder)
