"""Local-model estimates with a real tokenizer (issue 12, budgets): the OpenAI-compatible endpoint in front
of a real llama.cpp server (llama-cpp-python serving Gemma 3 270M, the rig of tests/peers/test_llama_cpp.py),
and the fallback for a server without a tokenizer (the shipped fake).

Proves: :class:`ServerTokenizer` counts with the server's own tokenizer (the same count as the server's
``/extras/tokenize``) and, for a server without a tokenizer route, answers None once and never asks again;
a non-streamed answer from llama.cpp is charged its reported usage (the reservation's bound was not below
it: not clamped); a streamed one (llama.cpp reports no usage) is charged the tokenizer's count of the
request and of what streamed — below the conservative bound, never below what the server itself counts.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx2
import openai
import pytest
import pytest_asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from peers.test_llama_cpp import MODEL, _post, llama  # noqa: E402,F401 - the module-scoped llama.cpp fixture

from relay_jupyter.backends.openai import ServerTokenizer  # noqa: E402
from relay_jupyter.broker.broker import Broker  # noqa: E402
from relay_jupyter.broker.config import BrokerConfig  # noqa: E402
from relay_jupyter.core.caller import Caller, CallerKind  # noqa: E402
from relay_jupyter.core.types import Grant  # noqa: E402
from relay_jupyter.server.plain import make_app  # noqa: E402
from relay_jupyter.testing import FakeOpenAI  # noqa: E402

pytestmark = [pytest.mark.peer, pytest.mark.slow]
ORIGIN = "daemon:llama"
PROMPT = [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "Name three colours of the rainbow."}]  # without a system message this model answers nothing


def _count(llama: str, text: str) -> int:
    return _post(llama + "/extras/tokenize/count", {"input": text})["count"]


@pytest.mark.asyncio
async def test_the_server_tokenizer_counts_with_llama_cpp_and_falls_back_elsewhere(llama: str) -> None:
    async with httpx2.AsyncClient() as http:
        counter = ServerTokenizer(llama + "/v1", http)
        assert counter.available is None
        words = "Name three colours of the rainbow, then say why the sky is blue."
        assert await counter.count(words) == _count(llama, words)
        assert counter.available is True

        with FakeOpenAI() as fake:  # no tokenizer route: None, asked once, then never again
            plain = ServerTokenizer(fake.base_url, http)
            assert await plain.count(words) is None and plain.available is False
            asked = len(fake.requests)
            assert await plain.count("more words") is None and len(fake.requests) == asked


@pytest_asyncio.fixture
async def endpoint(llama: str):
    broker = Broker.open(BrokerConfig(in_memory=True, openai_base_url=llama + "/v1"))
    broker.grants.issue(Grant(origin=ORIGIN, models=frozenset({MODEL}), consent_id="test"))
    server = make_app(broker, lambda h: Caller(kind=CallerKind.DAEMON, origin=ORIGIN, client_id=ORIGIN + ":1")
                      ).listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    yield broker, openai.AsyncOpenAI(api_key="x", base_url=f"http://127.0.0.1:{port}/relay/openai/v1", max_retries=0)
    server.stop()
    await server.close_all_connections()
    await server.request_callback.settings["relay_openai_proxy"].aclose()
    broker.close()


@pytest.mark.asyncio
async def test_llama_cpp_streams_are_charged_the_tokenizers_count(llama: str, endpoint) -> None:
    broker, client = endpoint
    answer = await client.chat.completions.create(model=MODEL, max_tokens=24, messages=PROMPT)
    reported = answer.usage.prompt_tokens
    stream = await client.chat.completions.create(model=MODEL, max_tokens=24, messages=PROMPT, stream=True)
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert streamed.strip()

    # the stream settles after its last byte (the tokenizer is asked then): wait for that record
    for _ in range(3000):
        records = [r for r in broker.audit.tail(50, origin=ORIGIN) if r.tool == f"model:{MODEL}"]
        if len(records) == 4:
            break
        await asyncio.sleep(0.01)
    allow1, settled1, allow2, settled2 = records
    assert settled1.arguments["basis"] == "reported"  # within the reservation's bounds: not clamped
    assert settled1.arguments["tokens"] == answer.usage.total_tokens
    assert settled2.arguments["basis"] == "estimated"
    charged = settled2.arguments["tokens"]
    output = _count(llama, streamed)  # what relay asked the server, for what streamed
    counted_input = charged - output
    # lower than the conservative bound, never lower than the server's own count of the same prompt
    assert reported <= counted_input < allow2.arguments["estimated_input_tokens"]
    assert output >= len(_post(llama + "/extras/tokenize", {"input": streamed})["tokens"]) > 0
    assert broker.ledger.usage(ORIGIN)["tokens"] == answer.usage.total_tokens + charged
