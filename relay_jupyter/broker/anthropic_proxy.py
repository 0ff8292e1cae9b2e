"""The Anthropic-compatible endpoint's broker side (issue 16 items 1-2): SDK code, LangChain and the
``claude`` CLI in a kernel reach Claude through the gate, with the broker's key.

``POST relay/anthropic/v1/messages`` (streaming or not), ``POST relay/anthropic/v1/messages/count_tokens``
and ``GET relay/anthropic/v1/models``. The transport (``server/anthropic_endpoint.py``) authenticates the
caller — a kernel credential sent as ``x-api-key`` or ``Authorization: Bearer`` — so the origin is the
broker's, never the request's. Here, for each request:

1. the body is bounded (:data:`MAX_BODY_BYTES`), JSON, an object with a string ``model`` and an integer
   ``max_tokens`` (what the Messages API requires); unknown top-level fields pass through untouched;
2. the gate reserves the whole request before anything is forwarded (``Gate.begin_completion`` with
   :func:`~relay_jupyter.core.budgets.estimate_request`: system, messages, tools, ``max_tokens``): grant,
   model allowlist (the grant's, the broker's ``allowed_models`` and the backend's), rate, token and
   cost budgets — every decision audited, as for ``%%agent`` runs (``purpose: proxy``);
3. the request goes upstream with the broker's key (``x-api-key``), the client's ``anthropic-version``
   and ``anthropic-beta`` headers and query (``?beta=true``); nothing else of the client's request (its
   credential, cookies, relay headers) leaves the broker;
4. the answer streams back byte for byte while its usage is read from the SSE events
   (``message_start`` and the cumulative ``message_delta``); the reservation is settled with it by the
   same rules as runs (no usage: an estimate; absurd usage: clamped; a stream cut or a client gone: the
   reservation). An upstream error answer is passed through with secrets masked.

Refusals are Anthropic-shaped error bodies (``{"type": "error", "error": {"type", "message"}}``) whose
message ends with the relay code (``[BUDGET_EXCEEDED]``), which the official SDKs raise as their own
exception types. A budget refusal carries ``x-should-retry: false`` (the SDKs would otherwise retry a 429).

The gate, forwarding and settling are shared with the OpenAI-compatible endpoint
(:mod:`relay_jupyter.broker.model_proxy`); this module is the Messages API's wire format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..core.budgets import RequestEstimate, RunBudget, estimate_request
from ..core.errors import Code, GateRefusal
from .model_proxy import (
    MAX_BODY_BYTES,
    MAX_SSE_EVENT_BYTES,
    GatedProxy,
    Meter,
    ProxyError,
    ProxyResponse,
    anthropic_error_body,
    ceiling_for,
    invalid,
    json_text,
    refusal,
)
# at import, not inside a request: stdlib only, and a first import inside a request is work an answer waits on
# (under pytest, whose assertion rewriter then parses it, it has failed with CPython 3.11.7's "AST constructor
# recursion depth mismatch" SystemError in a running request)
from .proxy_tools import AnthropicToolFilter

__all__ = ["MAX_BODY_BYTES", "MAX_SSE_EVENT_BYTES", "AnthropicProxy", "ProxyError", "ProxyResponse",
           "anthropic_error_body"]

DEFAULT_UPSTREAM = "https://api.anthropic.com"
#: The smallest ``max_tokens`` an engine's request is lowered to (see :meth:`AnthropicProxy.messages`): below it
#: the request is refused instead (a spent run budget), as an answer that short is of no use to an agent.
MIN_FITTED_OUTPUT = 1024
DEFAULT_VERSION = "2023-06-01"
# request headers forwarded upstream; everything else of the client's request stays in the broker
_FORWARDED = ("anthropic-version", "anthropic-beta", "accept")


class _AnthropicMeter(Meter):
    """Usage from ``message_start`` and the cumulative ``message_delta``; the end is ``message_stop``."""

    def _event(self, data: bytes) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            return  # not ours to judge: the client's SDK sees the same bytes
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "message_start":
            self.merge((event.get("message") or {}).get("usage"))
        elif kind == "message_delta":
            self.merge(event.get("usage"))
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            self.text(str(delta.get("text") or delta.get("partial_json") or ""))
        elif kind == "message_stop":
            self.stopped = True

    def _encode(self, event: dict[str, Any]) -> bytes:
        return (b"event: " + str(event.get("type", "message")).encode() + b"\ndata: "
                + json.dumps(event).encode() + b"\n\n")

    def feed_json(self, body: bytes) -> None:
        try:
            message = json.loads(body)
        except ValueError:
            return
        if isinstance(message, dict):
            self.merge(message.get("usage"))
            self.stopped = message.get("type") == "message"
            for block in message.get("content") or []:
                if isinstance(block, dict):
                    self.streamed_chars += len(str(block.get("text") or block.get("input") or ""))


def _tool_filter(policy: Any) -> Any:
    return None if policy is None else AnthropicToolFilter(policy)


class AnthropicProxy(GatedProxy):
    """The endpoint's logic for one broker. ``upstream`` and ``key`` are read from the broker's
    configuration on first use (the same sources as the ``anthropic`` backend: config, 0600 secrets file,
    the server's environment)."""

    returned_headers = ("content-type", "request-id", "anthropic-organization-id", "retry-after")
    wire = "anthropic"

    # -- configuration -------------------------------------------------------------------------
    def _resolve_upstream(self) -> tuple[str, Any]:
        if self._upstream is None:
            from ..backends.keys import KeySource
            from ..mcp.policy import check_model_endpoint, parse_insecure_endpoints

            config = self.broker.config
            keys = KeySource({"anthropic": config.anthropic_api_key.get_secret_value()
                              if config.anthropic_api_key else ""}, config.secrets_file)
            key = keys.get("anthropic")
            if key is None:
                raise ProxyError(503, "api_error", "this relay broker has no Anthropic API key configured "
                                 "(set ANTHROPIC_API_KEY for the Jupyter server, c.RelayApp.anthropic_api_key "
                                 "or the secrets file)", code=Code.BACKEND_UNREACHABLE.value, retry=False)
            url = config.anthropic_base_url or DEFAULT_UPSTREAM
            insecure = parse_insecure_endpoints(getattr(config, "allow_insecure_endpoints", ()))
            url = check_model_endpoint(url, "c.RelayApp.anthropic_base_url", allow_insecure=insecure)
            self._upstream = (url.rstrip("/"), key)
        return self._upstream

    def _served(self, model: str) -> bool:
        """The broker-wide allowlist (``c.RelayApp.allowed_models``), else the backend's model patterns."""
        from ..backends.anthropic import DEFAULT_MODELS
        from ..backends.base import model_allowed

        return model_allowed(model, tuple(self.broker.config.allowed_models) or DEFAULT_MODELS)

    def _headers(self, key: Any, client_headers: Mapping[str, str]) -> dict[str, str]:
        out = {"content-type": "application/json", "x-api-key": key.reveal(),
               "anthropic-version": DEFAULT_VERSION}
        for name in _FORWARDED:
            value = client_headers.get(name)
            if value and len(value) < 4096 and "\n" not in value and "\r" not in value:
                out[name] = value
        return out

    # -- requests ----------------------------------------------------------------------------------
    async def messages(self, origin: str, body: bytes, query: Mapping[str, str],
                       client_headers: Mapping[str, str], *, count_tokens: bool = False,
                       run: RunBudget | None = None) -> ProxyResponse:
        """Gate and forward one ``/v1/messages`` (or ``/count_tokens``) request. ``run``: the caps of the run
        the request belongs to (an engine's, broker/engine_endpoint.py): its steps and reserved/used tokens are
        counted, and a request that would pass ``max_steps_per_run`` or ``max_tokens_per_run`` is refused.

        Raises:
            ProxyError: a refusal or upstream failure, to be answered as an Anthropic error body.
        """
        message = self._parse(body)
        model = message["model"]
        self._check_model(origin, model)
        profile = self._profile(origin, client_headers)
        url, key = self._upstream_for(profile)
        params = {k: v for k, v in query.items() if k == "beta"}
        headers = self._headers(key, client_headers)
        if count_tokens:
            # counting is free upstream: it needs the grant and the model, not a budget reservation
            gate = self.broker.gate
            grant = gate.grants.get(origin)
            if grant is None:
                raise refusal(GateRefusal(Code.UNAUTHORIZED, f"{origin} has no grant: connect this notebook "
                                          "to relay first"))
            if not grant.allows_model(model):
                raise refusal(GateRefusal(Code.SCOPE_EXCEEDED, f"the model {model!r} is not in this "
                                          "notebook's grant"))
            self._grant(origin)  # it spends the broker's upstream rate limit
            return await self._forward(f"{url}/v1/messages/count_tokens", body, params, headers, key,
                                       None, None, None)
        max_tokens = message.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise invalid("max_tokens: a positive integer is required")
        system = message.get("system")
        messages = message.get("messages")
        if not isinstance(messages, list):
            raise invalid("messages: a list is required")
        tools = message.get("tools") if isinstance(message.get("tools"), list) else []
        estimate = estimate_request(json_text(system or ""), [m if isinstance(m, Mapping) else {"content": m}
                                                              for m in messages],
                                    [t if isinstance(t, Mapping) else {"tool": t} for t in tools], max_tokens)
        asked = max_tokens
        if run is not None:
            # an engine's run (the claude CLI asks max_tokens 32000 at every request, most of it never used):
            # lower max_tokens to what the run's token cap and the day budgets still leave after this input,
            # so the reservation fits and the run is refused only when not even MIN_FITTED_OUTPUT would fit.
            # The reservation below still checks every limit: a fitted request is never over a budget.
            room = self.broker.gate.completion_room(origin, model, estimate.input_tokens, run=run,
                                                    profile=profile)
            if room is not None and MIN_FITTED_OUTPUT <= room < max_tokens:
                max_tokens = message["max_tokens"] = room
                body = json.dumps(message, ensure_ascii=False).encode()
                estimate = RequestEstimate(estimate.input_tokens, max_tokens)
        # the session and lineage (pure hashing; stored by _forward only once the answer completed)
        sessions = getattr(self.broker, "sessions", None)
        observed = await sessions.observe_async(origin, client_headers, message) if sessions is not None else None
        # everything that can fail before the request goes out comes before the reservation: a hold taken and
        # then left by an exception would be charged in full when it expires
        meter = _AnthropicMeter(ceiling_chars=ceiling_for(max_tokens),
                                tool_filter=_tool_filter(self._tool_policy(origin, model)))
        reservation = await self._reserve(origin, model, estimate, profile, run=run, asked_output=asked)
        return await self._forward(f"{url}/v1/messages", body, params, headers, key, reservation, model, meter,
                                   observed=observed, profile=profile, run=run)

    async def models(self, origin: str, query: Mapping[str, str], client_headers: Mapping[str, str]
                     ) -> ProxyResponse:
        """``GET /v1/models``, filtered to the models this origin's grant and the broker allow."""
        grant = self._grant(origin)
        url, key = self._upstream_for(self._profile(origin, client_headers))
        params = {k: v for k, v in query.items() if k in ("limit", "after_id", "before_id", "beta")}
        return await self._get_models(f"{url}/v1/models", params, self._headers(key, client_headers), key, grant)
