"""The OpenAI-compatible endpoint's broker side (issue 16 item 8): the ``openai`` SDK, LangChain's
``ChatOpenAI`` or any Chat Completions client in a kernel reaches the configured OpenAI-compatible server
(``c.RelayApp.openai_base_url``: llama.cpp, vLLM, Ollama, LM Studio, OpenAI) through the gate.

``POST relay/openai/v1/chat/completions`` (streaming or not) and ``GET relay/openai/v1/models``. The gate,
forwarding and settling are the Anthropic endpoint's (:mod:`relay_jupyter.broker.model_proxy`); this module
is the wire format:

- the body must be an object with a string ``model`` and a non-empty ``messages`` list of objects;
  ``max_tokens`` / ``max_completion_tokens`` (positive integers), ``n`` (1..128) and ``stream`` (a boolean)
  are checked when present; everything else passes through;
- the reservation is the whole request (every message as JSON: content, tool calls, tool results; the
  tool definitions; ``response_format``, ``tool_choice``, ``functions``) plus the answer's bound, which is
  ``max_tokens`` (or ``max_completion_tokens``) times ``n``. A request that names no bound is sent with
  ``max_tokens`` = :data:`DEFAULT_MAX_OUTPUT` added (the only change relay makes to a body): an
  unbounded answer could spend anything;
- the reservation uses the conservative bounds of ``core/budgets.estimate_text_tokens`` (nothing is sent
  upstream before the gate decided); an answer without usage — llama.cpp streams none — is charged an
  estimate: when the server counts tokens (llama.cpp's ``/tokenize`` or llama-cpp-python's
  ``/extras/tokenize/count``, :class:`~relay_jupyter.backends.openai.ServerTokenizer`) its count of what
  streamed plus its count of the request (with the framing bounds), else the conservative bounds;
- usage is read from the ``usage`` object (the JSON answer, or the stream's last chunk when the client
  asked for ``stream_options.include_usage``; ``prompt_tokens_details.cached_tokens`` as cache reads);
  an answer is complete on ``finish_reason`` or ``data: [DONE]``; a stream that carries an error object
  failed (the client's SDK raises on the same bytes).

Only ``accept`` of the client's headers goes upstream, with the broker's key (``Authorization: Bearer``,
from ``c.RelayApp.openai_api_key``, the secrets file's ``openai`` or the server's ``$OPENAI_API_KEY``; none
for a local server that needs none); ``content-type``, ``retry-after`` and ``x-request-id`` come back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..core.budgets import (
    MESSAGE_OVERHEAD,
    REQUEST_OVERHEAD,
    TOOL_OVERHEAD,
    TOOLS_PROMPT_OVERHEAD,
    RequestEstimate,
    estimate_request,
)
from ..core.errors import Code
from .model_proxy import GatedProxy, Meter, ProxyError, ProxyResponse, ceiling_for, invalid, json_text

__all__ = ["DEFAULT_MAX_OUTPUT", "MAX_CHOICES", "OpenAIProxy"]

#: The answer bound of a request that names none (``max_tokens`` is added to what is forwarded).
DEFAULT_MAX_OUTPUT = 4096
#: Largest ``n`` (choices per request) accepted.
MAX_CHOICES = 128
# top-level fields that servers turn into prompt tokens besides messages and tools
_PROMPT_FIELDS = ("tool_choice", "response_format", "functions", "function_call")


def _int_field(message: Mapping[str, Any], name: str, upper: int | None = None) -> int | None:
    value = message.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (upper is not None and value > upper):
        raise invalid(f"{name}: an integer >= 1" + (f" and <= {upper}" if upper is not None else "") + " is required")
    return value


def _relay_usage(raw: Any) -> dict[str, Any] | None:
    """OpenAI usage -> relay's field names (``prompt_tokens`` includes the cached ones)."""
    if not isinstance(raw, Mapping):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    prompt = raw.get("prompt_tokens")
    out: dict[str, Any] = {"output_tokens": raw.get("completion_tokens")}
    if isinstance(prompt, int) and not isinstance(prompt, bool):
        if isinstance(cached, int) and not isinstance(cached, bool) and 0 < cached <= prompt:
            out["input_tokens"], out["cache_read_input_tokens"] = prompt - cached, cached
        else:
            out["input_tokens"] = prompt
    return out


def _tools(message: Mapping[str, Any]) -> list[Any]:
    tools = message.get("tools")
    return tools if isinstance(tools, list) else []


def _extra(message: Mapping[str, Any]) -> dict[str, Any]:
    return {k: message[k] for k in _PROMPT_FIELDS if message.get(k) is not None}


def _pseudo(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every message whole (content, tool calls, tool results as JSON), and the prompt-shaping fields."""
    extra = _extra(message)
    return [{"content": m} for m in message["messages"]] + ([{"content": extra}] if extra else [])


class _OpenAIMeter(Meter):
    """Usage from the ``usage`` object; complete on ``finish_reason`` or ``[DONE]``, failed on an error object."""

    failed: bool = False
    counter: Any = None  # the upstream's ServerTokenizer, set by the proxy

    def _event(self, data: bytes) -> None:
        if data.strip() == b"[DONE]":
            self.stopped = not self.failed
            return
        try:
            event = json.loads(data)
        except ValueError:
            return  # not ours to judge: the client's SDK sees the same bytes
        if not isinstance(event, dict):
            return
        if event.get("error") is not None:
            self.failed, self.stopped = True, False
            return
        self._choices(event.get("choices"), "delta")
        usage = _relay_usage(event.get("usage"))
        if usage is not None:
            self.merge(usage)

    def _choices(self, choices: Any, key: str) -> None:
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            part = choice.get(key)
            if isinstance(part, dict):
                for name in ("content", "reasoning_content", "refusal"):
                    if isinstance(part.get(name), str):
                        self.text(part[name])
                for call in part.get("tool_calls") or []:
                    fn = call.get("function") if isinstance(call, dict) else None
                    if isinstance(fn, dict):
                        for name in ("name", "arguments"):
                            if isinstance(fn.get(name), str):
                                self.text(fn[name])
            if choice.get("finish_reason") and not self.failed:
                self.stopped = True

    def _encode(self, event: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(event).encode() + b"\n\n"

    def feed_json(self, body: bytes) -> None:
        try:
            answer = json.loads(body)
        except ValueError:
            return
        if not isinstance(answer, dict):
            return
        self.ceiling_chars = None  # the whole answer is here already: nothing left to cut
        self._choices(answer.get("choices"), "message")
        usage = _relay_usage(answer.get("usage"))
        if usage is not None:
            self.merge(usage)


class OpenAIProxy(GatedProxy):
    """The OpenAI-compatible endpoint's logic for one broker; the upstream and its optional key are read
    from the broker's configuration on first use."""

    returned_headers = ("content-type", "retry-after", "x-request-id")
    wire = "openai"
    upstream_name = "the OpenAI-compatible server"

    def __init__(self, broker: Any, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self._tokenizers: dict[str, Any] = {}

    # -- configuration -------------------------------------------------------------------------
    def _resolve_upstream(self) -> tuple[str, Any]:
        if self._upstream is None:
            from ..backends.keys import KeySource
            from ..mcp.policy import check_model_endpoint, parse_insecure_endpoints

            config = self.broker.config
            if not config.openai_base_url:
                raise ProxyError(503, "api_error", "this relay broker has no OpenAI-compatible server configured "
                                 "(c.RelayApp.openai_base_url)", code=Code.NO_BACKEND.value, retry=False)
            keys = KeySource({"openai": config.openai_api_key.get_secret_value()
                              if config.openai_api_key else ""}, config.secrets_file)
            insecure = parse_insecure_endpoints(getattr(config, "allow_insecure_endpoints", ()))
            url = check_model_endpoint(config.openai_base_url, "c.RelayApp.openai_base_url",
                                       allow_insecure=insecure)
            self._upstream = (self._base_url(url), keys.get("openai"))
        return self._upstream

    def _served(self, model: str) -> bool:
        """The broker-wide allowlist (``c.RelayApp.allowed_models``), else every model (the backend's ``*``)."""
        from ..backends.base import model_allowed

        return model_allowed(model, tuple(self.broker.config.allowed_models) or ("*",))

    def _headers(self, key: Any, client_headers: Mapping[str, str]) -> dict[str, str]:
        out = {"content-type": "application/json"}
        if key is not None:
            out["authorization"] = f"Bearer {key.reveal()}"
        accept = client_headers.get("accept")
        if accept and len(accept) < 1024 and "\n" not in accept and "\r" not in accept:
            out["accept"] = accept
        return out

    def _base_url(self, url: str) -> str:
        from ..backends.openai import chat_url

        return chat_url(url)[: -len("/chat/completions")]  # ".../v1", given with or without it

    def _counter(self, upstream: tuple[str, Any] | None = None) -> Any:
        """The tokenizer of ``upstream`` (default: the broker's own;
        :class:`~relay_jupyter.backends.openai.ServerTokenizer`), made on first use."""
        url, key = upstream if upstream is not None else self._resolve_upstream()
        counter = self._tokenizers.get(url)
        if counter is None:
            from ..backends.openai import ServerTokenizer

            counter = self._tokenizers[url] = ServerTokenizer(url, self._http(), self._headers(key, {}))
        return counter

    # -- estimates ---------------------------------------------------------------------------------
    @staticmethod
    def estimate(message: Mapping[str, Any], max_output: int) -> RequestEstimate:
        """The reservation's bound of ``message`` (conservative; no request to the server before the gate)."""
        return estimate_request("", _pseudo(message), [t if isinstance(t, Mapping) else {"tool": t}
                                                       for t in _tools(message)], max_output)

    async def counted_input(self, message: Mapping[str, Any], counter: Any = None) -> int | None:
        """The request's input counted with the server's own tokenizer, plus framing (the role markers and
        tool prompt the conservative estimate also adds), or None when the server cannot count."""
        messages, tools = message["messages"], _tools(message)
        extra = _extra(message)
        pieces = [json_text(m) for m in messages] + [json_text(t) for t in tools] + ([json_text(extra)] if extra else [])
        counted = await (counter or self._counter()).count("\n".join(pieces))
        if counted is None:
            return None
        # each piece as JSON holds its text, so the count bounds the text's; one token per join
        n = REQUEST_OVERHEAD + counted + len(pieces) + MESSAGE_OVERHEAD * len(_pseudo(message))
        if tools:
            n += TOOL_OVERHEAD * len(tools) + TOOLS_PROMPT_OVERHEAD
        return n

    async def _unreported(self, reservation: Any, meter: Meter) -> int:
        """A complete answer without usage (llama.cpp streaming): when the server counts tokens, the output
        is its count of what streamed, and the input bound the estimate charges is lowered to its count of
        the request (never raised). Asked only after the gate allowed the request and the answer ended."""
        counter = getattr(meter, "counter", None) or self._counter()
        text = meter.kept_text
        if counter.available is not False and text is not None and isinstance(meter.request, Mapping):
            output = await counter.count(text)
            if output is not None:
                estimate = getattr(reservation, "estimate", None)
                counted = await self.counted_input(meter.request, counter)
                if estimate is not None and counted is not None and counted < estimate.input_tokens:
                    reservation.estimate = RequestEstimate(input_tokens=counted, max_output=estimate.max_output)
                return output
        return await super()._unreported(reservation, meter)

    # -- requests ----------------------------------------------------------------------------------
    async def chat_completions(self, origin: str, body: bytes, client_headers: Mapping[str, str]) -> ProxyResponse:
        """Gate and forward one ``/v1/chat/completions`` request.

        Raises:
            ProxyError: a refusal or upstream failure, to be answered as an OpenAI error body.
        """
        message = self._parse(body)
        model = message["model"]
        self._check_model(origin, model)
        profile = self._profile(origin, client_headers)
        url, key = self._upstream_for(profile)
        messages = message.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise invalid("messages: a non-empty list of message objects is required")
        if "stream" in message and not isinstance(message["stream"], bool):
            raise invalid("stream: a boolean is required")
        bounds = [b for b in (_int_field(message, "max_tokens"), _int_field(message, "max_completion_tokens"))
                  if b is not None]
        choices = _int_field(message, "n", MAX_CHOICES) or 1
        if not bounds:  # an unbounded answer could spend anything: send the bound that is reserved
            message["max_tokens"] = DEFAULT_MAX_OUTPUT
            body = json.dumps(message).encode()
            bounds = [DEFAULT_MAX_OUTPUT]
        max_output = max(bounds) * choices
        reservation = await self._reserve(origin, model, self.estimate(message, max_output), profile)
        policy = self._tool_policy(origin, model)
        if policy is not None:
            from .proxy_tools import OpenAIToolFilter

            policy = OpenAIToolFilter(policy)
        counter = self._counter((url, key))
        meter = _OpenAIMeter(ceiling_chars=ceiling_for(max_output), keep_text=counter.available is not False,
                             request=message, tool_filter=policy)
        meter.counter = counter
        # the session and lineage, as for the Messages API (a system message is one of the messages here)
        sessions = getattr(self.broker, "sessions", None)
        observed = await sessions.observe_async(origin, client_headers, message) if sessions is not None else None
        return await self._forward(f"{url}/chat/completions", body, {}, self._headers(key, client_headers), key,
                                   reservation, model, meter, observed=observed, profile=profile)

    async def models(self, origin: str, client_headers: Mapping[str, str]) -> ProxyResponse:
        """``GET /v1/models``, filtered to the models this origin's grant and the broker allow."""
        grant = self._grant(origin)
        url, key = self._upstream_for(self._profile(origin, client_headers))
        return await self._get_models(f"{url}/models", {}, self._headers(key, client_headers), key, grant)
