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

Written on ``httpx2`` (the SDKs' transport) rather than through the SDK client: a proxy must forward
bodies and SSE bytes it does not model (new fields, new event types) unchanged.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.budgets import Reservation, estimate_request
from ..core.errors import Code, GateRefusal
from ..core.redact import mask_secret_text
from ..core.types import Usage

__all__ = ["MAX_BODY_BYTES", "MAX_SSE_EVENT_BYTES", "AnthropicProxy", "ProxyError", "ProxyResponse",
           "anthropic_error_body"]

log = logging.getLogger(__name__)

#: Largest request body accepted (Claude Code sends long histories; images are base64 in the body).
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Largest single SSE event read from upstream while streaming (bounded memory per stream).
MAX_SSE_EVENT_BYTES = 1024 * 1024
DEFAULT_UPSTREAM = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"
_UPSTREAM_TIMEOUT = 600.0
# request headers forwarded upstream; everything else of the client's request stays in the broker
_FORWARDED = ("anthropic-version", "anthropic-beta", "accept")
# response headers passed back to the client
_RETURNED = ("content-type", "request-id", "anthropic-organization-id", "retry-after")


class ProxyError(Exception):
    """A refusal or failure answered with an Anthropic-shaped error body."""

    def __init__(self, status: int, error_type: str, message: str, *, code: str | None = None,
                 retry: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.code = code
        self.retry = retry

    def body(self) -> bytes:
        return anthropic_error_body(self.error_type, self.message, self.code)

    def headers(self) -> dict[str, str]:
        return {} if self.retry else {"x-should-retry": "false"}


def anthropic_error_body(error_type: str, message: str, code: str | None = None) -> bytes:
    """The Messages API's error shape; the relay code (if any) ends the message and is a field too."""
    text = f"relay: {message}" + (f" [{code}]" if code else "")
    body: dict[str, Any] = {"type": "error", "error": {"type": error_type, "message": text}}
    if code:
        body["relay_code"] = code
    return json.dumps(body).encode()


# gate refusal code -> (HTTP status, Anthropic error type, may the SDK retry)
_REFUSALS: dict[str, tuple[int, str, bool]] = {
    Code.UNAUTHORIZED.value: (403, "permission_error", False),
    Code.SCOPE_EXCEEDED.value: (403, "permission_error", False),
    Code.BUDGET_EXCEEDED.value: (429, "rate_limit_error", False),
}


def _refusal(exc: GateRefusal) -> ProxyError:
    status, kind, retry = _REFUSALS.get(exc.code.value, (403, "permission_error", False))
    return ProxyError(status, kind, exc.message, code=exc.code.value, retry=retry)


def _invalid(message: str) -> ProxyError:
    return ProxyError(400, "invalid_request_error", message)


@dataclass
class ProxyResponse:
    """What the transport writes: a status, headers, then ``chunks`` (one whole body, or SSE bytes)."""

    status: int
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]
    streaming: bool = False


@dataclass
class _Meter:
    """Usage read from the answer as it passes (SSE events or the JSON body)."""

    usage: Usage = field(default_factory=Usage)
    stopped: bool = False
    streamed_chars: int = 0
    _buf: bytearray = field(default_factory=bytearray)

    def feed_sse(self, chunk: bytes) -> None:
        self._buf += chunk
        while True:
            end = _event_end(self._buf)
            if end is None:
                if len(self._buf) > MAX_SSE_EVENT_BYTES:
                    raise ProxyError(502, "api_error", "the model server sent an SSE event over "
                                     f"{MAX_SSE_EVENT_BYTES} bytes", code=Code.BACKEND_ERROR.value)
                return
            raw, self._buf = bytes(self._buf[:end[0]]), self._buf[end[1]:]
            self._event(raw)

    def _event(self, raw: bytes) -> None:
        data = b"\n".join(line[5:].lstrip(b" ") for line in raw.replace(b"\r\n", b"\n").split(b"\n")
                          if line.startswith(b"data:"))
        if not data:
            return
        try:
            event = json.loads(data)
        except ValueError:
            return  # not ours to judge: the client's SDK sees the same bytes
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "message_start":
            self._merge((event.get("message") or {}).get("usage"))
        elif kind == "message_delta":
            self._merge(event.get("usage"))
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            self.streamed_chars += len(str(delta.get("text") or delta.get("partial_json") or ""))
        elif kind == "message_stop":
            self.stopped = True

    def feed_json(self, body: bytes) -> None:
        try:
            message = json.loads(body)
        except ValueError:
            return
        if isinstance(message, dict):
            self._merge(message.get("usage"))
            self.stopped = message.get("type") == "message"
            for block in message.get("content") or []:
                if isinstance(block, dict):
                    self.streamed_chars += len(str(block.get("text") or block.get("input") or ""))

    def _merge(self, usage: Any) -> None:
        # message_delta.usage is cumulative; a field it leaves out keeps its earlier value
        if not isinstance(usage, Mapping):
            return
        values = self.usage.model_dump()
        for name in values:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                values[name] = value
        self.usage = Usage.model_construct(**values)


def _event_end(buf: bytearray) -> tuple[int, int] | None:
    """(end of the first event, start of the next) in ``buf``, or None when no event is complete."""
    best: tuple[int, int] | None = None
    for sep in (b"\n\n", b"\r\n\r\n"):
        i = buf.find(sep)
        if i != -1 and (best is None or i < best[0]):
            best = (i, i + len(sep))
    return best


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


class AnthropicProxy:
    """The endpoint's logic for one broker. ``upstream`` and ``key`` are read from the broker's
    configuration on first use (the same sources as the ``anthropic`` backend: config, 0600 secrets file,
    the server's environment)."""

    def __init__(self, broker: Any, *, client_factory: Callable[[], Any] | None = None) -> None:
        self.broker = broker
        self._client_factory = client_factory
        self._client: Any = None
        self._upstream: tuple[str, Any] | None = None

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

    def _http(self) -> Any:
        if self._client is None:
            if self._client_factory is not None:
                self._client = self._client_factory()
            else:
                import httpx2

                self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(_UPSTREAM_TIMEOUT, connect=10.0),
                                                  follow_redirects=False, trust_env=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- requests ----------------------------------------------------------------------------------
    def _parse(self, body: bytes) -> dict[str, Any]:
        if len(body) > MAX_BODY_BYTES:
            raise ProxyError(413, "request_too_large", f"the request body is over {MAX_BODY_BYTES} bytes")
        try:
            message = json.loads(body)
        except ValueError:
            raise _invalid("the request body is not valid JSON") from None
        if not isinstance(message, dict):
            raise _invalid("the request body must be a JSON object")
        model = message.get("model")
        if not isinstance(model, str) or not model or len(model) > 256:
            raise _invalid("model: a model id (string) is required")
        return message

    def _served(self, model: str) -> bool:
        """The broker-wide allowlist (``c.RelayApp.allowed_models``), else the backend's model patterns."""
        from ..backends.anthropic import DEFAULT_MODELS
        from ..backends.base import model_allowed

        return model_allowed(model, tuple(self.broker.config.allowed_models) or DEFAULT_MODELS)

    def _check_model(self, origin: str, model: str) -> None:
        if not self._served(model):
            raise ProxyError(403, "permission_error", f"the model {model!r} is not served by this broker",
                             code=Code.SCOPE_EXCEEDED.value, retry=False)

    def _headers(self, key: Any, client_headers: Mapping[str, str]) -> dict[str, str]:
        out = {"content-type": "application/json", "x-api-key": key.reveal(),
               "anthropic-version": DEFAULT_VERSION}
        for name in _FORWARDED:
            value = client_headers.get(name)
            if value and len(value) < 4096 and "\n" not in value and "\r" not in value:
                out[name] = value
        return out

    async def messages(self, origin: str, body: bytes, query: Mapping[str, str],
                       client_headers: Mapping[str, str], *, count_tokens: bool = False) -> ProxyResponse:
        """Gate and forward one ``/v1/messages`` (or ``/count_tokens``) request.

        Raises:
            ProxyError: a refusal or upstream failure, to be answered as an Anthropic error body.
        """
        message = self._parse(body)
        model = message["model"]
        self._check_model(origin, model)
        url, key = self._resolve_upstream()
        gate = self.broker.gate
        if count_tokens:
            # counting is free upstream: it needs the grant and the model, not a budget reservation
            grant = gate.grants.get(origin)
            if grant is None:
                raise _refusal(GateRefusal(Code.UNAUTHORIZED, f"{origin} has no grant: connect this notebook "
                                           "to relay first"))
            if not grant.allows_model(model):
                raise _refusal(GateRefusal(Code.SCOPE_EXCEEDED, f"the model {model!r} is not in this "
                                           "notebook's grant"))
            try:
                gate.ledger.take_request(origin, grant)  # it spends the broker's upstream rate limit
            except GateRefusal as exc:
                raise _refusal(exc) from None
            return await self._forward(f"{url}/v1/messages/count_tokens", body, query, key, client_headers,
                                       None, None, stream=False)
        max_tokens = message.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _invalid("max_tokens: a positive integer is required")
        system = message.get("system")
        messages = message.get("messages")
        if not isinstance(messages, list):
            raise _invalid("messages: a list is required")
        tools = message.get("tools") if isinstance(message.get("tools"), list) else []
        estimate = estimate_request(_text(system or ""), [m if isinstance(m, Mapping) else {"content": m}
                                                          for m in messages],
                                    [t if isinstance(t, Mapping) else {"tool": t} for t in tools], max_tokens)
        try:
            reservation = gate.begin_completion(origin, model, estimate=estimate, purpose="proxy")
        except GateRefusal as exc:
            raise _refusal(exc) from None
        stream = message.get("stream") is True
        return await self._forward(f"{url}/v1/messages", body, query, key, client_headers, reservation, model,
                                   stream=stream)

    async def models(self, origin: str, query: Mapping[str, str], client_headers: Mapping[str, str]
                     ) -> ProxyResponse:
        """``GET /v1/models``, filtered to the models this origin's grant and the broker allow."""
        grant = self.broker.gate.grants.get(origin)
        if grant is None:
            raise _refusal(GateRefusal(Code.UNAUTHORIZED, f"{origin} has no grant: connect this notebook to "
                                       "relay first"))
        try:
            self.broker.gate.ledger.take_request(origin, grant)
        except GateRefusal as exc:
            raise _refusal(exc) from None
        url, key = self._resolve_upstream()
        import httpx2

        params = {k: v for k, v in query.items() if k in ("limit", "after_id", "before_id", "beta")}
        try:
            resp = await self._http().get(f"{url}/v1/models", params=params,
                                          headers=self._headers(key, client_headers))
        except httpx2.TimeoutException:
            raise ProxyError(504, "api_error", "the model server did not answer in time",
                             code=Code.BACKEND_TIMEOUT.value) from None
        except httpx2.HTTPError as exc:
            raise ProxyError(502, "api_error", f"the model server could not be reached ({type(exc).__name__})",
                             code=Code.BACKEND_UNREACHABLE.value) from None
        body = resp.content
        if resp.status_code == 200:
            try:
                listing = json.loads(body)
                listing["data"] = [m for m in listing.get("data", []) if isinstance(m, dict)
                                   and isinstance(m.get("id"), str) and grant.allows_model(m["id"])
                                   and self._served(m["id"])]
                body = json.dumps(listing).encode()
            except (ValueError, AttributeError, TypeError):
                raise ProxyError(502, "api_error", "the model server sent a malformed model list",
                                 code=Code.BACKEND_ERROR.value) from None
        return ProxyResponse(resp.status_code, self._returned(resp.headers), _once(self._masked(body, key)))

    # -- forwarding --------------------------------------------------------------------------------
    def _returned(self, headers: Mapping[str, str]) -> dict[str, str]:
        return {name: headers[name] for name in _RETURNED if name in headers}

    @staticmethod
    def _masked(body: bytes, key: Any) -> bytes:
        text = body.decode("utf-8", "replace").replace(key.reveal(), "<masked>")
        return mask_secret_text(text).encode()

    async def _forward(self, url: str, body: bytes, query: Mapping[str, str], key: Any,
                       client_headers: Mapping[str, str], reservation: Reservation | None, model: str | None,
                       *, stream: bool) -> ProxyResponse:
        import httpx2

        params = {k: v for k, v in query.items() if k == "beta"}
        client = self._http()
        request = client.build_request("POST", url, params=params, content=body,
                                       headers=self._headers(key, client_headers))
        started = time.monotonic()
        try:
            resp = await client.send(request, stream=True)
        except httpx2.TimeoutException:
            self._settle(reservation, model, None, "not_started", 0)
            raise ProxyError(504, "api_error", "the model server did not answer in time",
                             code=Code.BACKEND_TIMEOUT.value) from None
        except httpx2.HTTPError as exc:
            self._settle(reservation, model, None, "not_started", 0)
            raise ProxyError(502, "api_error", f"the model server could not be reached ({type(exc).__name__})",
                             code=Code.BACKEND_UNREACHABLE.value) from None
        headers = self._returned(resp.headers)
        if resp.status_code != 200:
            try:
                raw = await resp.aread()
            finally:
                await resp.aclose()
            self._settle(reservation, model, None, "refused", 0)
            return ProxyResponse(resp.status_code, headers, _once(self._masked(raw[:MAX_BODY_BYTES], key)))
        meter = _Meter()
        sse = "text/event-stream" in resp.headers.get("content-type", "")

        async def chunks() -> AsyncIterator[bytes]:
            outcome = "interrupted"
            collected = bytearray()
            try:
                async for chunk in resp.aiter_raw():
                    if sse:
                        meter.feed_sse(chunk)
                        yield chunk
                    else:
                        collected += chunk
                        if len(collected) > MAX_BODY_BYTES:
                            raise ProxyError(502, "api_error", "the model server's answer is too large",
                                             code=Code.BACKEND_ERROR.value)
                if not sse:
                    meter.feed_json(bytes(collected))
                    yield bytes(collected)
                outcome = "complete" if meter.stopped else "interrupted"
            finally:
                await resp.aclose()
                self._settle(reservation, model, meter.usage, outcome, meter.streamed_chars // 3)
                log.debug("relay proxy: %s %s in %.3f s (%s)", model, outcome, time.monotonic() - started,
                          "stream" if sse else "json")

        return ProxyResponse(200, headers, chunks(), streaming=sse)

    def _settle(self, reservation: Reservation | None, model: str | None, usage: Usage | None, outcome: str,
                streamed: int) -> None:
        if reservation is None or model is None:
            return
        try:
            self.broker.gate.settle_completion(reservation, model, usage if usage and usage.total else None,
                                               outcome=outcome, streamed_output_tokens=streamed)
        except Exception:  # noqa: BLE001 - settling must never break the answer; the ledger keeps the hold
            log.exception("relay proxy: settling a request failed")


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


