"""``relay/anthropic/v1/...``: the Anthropic-compatible endpoint's HTTP side (logic in
:mod:`relay_jupyter.broker.anthropic_proxy`), a tornado mixin independent of how the caller is
authenticated: ``server/anthropic_handlers.py`` inside Jupyter, ``server/plain.py`` in the daemon (its token
as ``x-api-key`` or ``Authorization: Bearer`` on TCP, or the Unix socket; origin ``daemon:<X-Relay-Client>``).

Inside Jupyter, who may call: a kernel of this server with its own credential (``RELAY_KERNEL_CREDENTIAL``), sent the way
the Anthropic SDKs and the ``claude`` CLI send a key — ``x-api-key: <credential>`` or
``Authorization: Bearer <credential>``. Nothing else: no Jupyter token or cookie (an SDK in a browser tab
is not a kernel), no fallback to Jupyter's login page. A missing or wrong credential is HTTP 401 with the
Messages API's ``authentication_error`` body, which the SDKs raise as ``AuthenticationError``.
"""

from __future__ import annotations

from typing import Any

from tornado.iostream import StreamClosedError

from ..broker.anthropic_proxy import MAX_BODY_BYTES, AnthropicProxy, ProxyError, anthropic_error_body

__all__ = ["ANTHROPIC_PATHS", "AnthropicEndpoint", "proxy_credential"]

#: Paths under the relay prefix, and the verb each answers.
ANTHROPIC_PATHS = {"anthropic/v1/messages": "POST", "anthropic/v1/messages/count_tokens": "POST",
                   "anthropic/v1/models": "GET"}


def proxy_credential(headers: Any) -> str:
    """The credential an Anthropic client sends: ``x-api-key``, else ``Authorization: Bearer``."""
    key = headers.get("x-api-key", "").strip()
    if key:
        return key
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


class AnthropicEndpoint:
    """Transport-neutral: needs ``self.relay_caller`` (set by the auth base) and ``settings["relay_broker"]``."""

    relay_caller: Any

    def _proxy(self) -> AnthropicProxy:
        settings = self.settings  # type: ignore[attr-defined]
        proxy = settings.get("relay_anthropic_proxy")
        if proxy is None:
            proxy = settings["relay_anthropic_proxy"] = AnthropicProxy(settings["relay_broker"])
        return proxy

    def _refuse_early(self, status: int, error_type: str, message: str) -> None:
        """Answer now (from ``prepare``) with an Anthropic error body."""
        self.set_status(status)  # type: ignore[attr-defined]
        self.set_header("Content-Type", "application/json")  # type: ignore[attr-defined]
        self.finish(anthropic_error_body(error_type, message))  # type: ignore[attr-defined]

    def check_body_size(self) -> bool:
        length = self.request.headers.get("Content-Length")  # type: ignore[attr-defined]
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            self._refuse_early(413, "request_too_large", f"the request body is over {MAX_BODY_BYTES} bytes")
            return False
        return True

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # every error of this endpoint, ours or tornado's, in the shape the SDKs parse
        kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large"}
        reason = getattr(kwargs.get("exc_info", (None, None))[1], "log_message", None) or self._reason  # type: ignore[attr-defined]
        self.set_header("Content-Type", "application/json")  # type: ignore[attr-defined]
        self.finish(anthropic_error_body(kinds.get(status_code, "api_error"), str(reason)))  # type: ignore[attr-defined]

    def _query(self) -> dict[str, str]:
        args = self.request.query_arguments  # type: ignore[attr-defined]
        return {k: v[-1].decode("utf-8", "replace") for k, v in args.items() if v}

    def _client_headers(self) -> dict[str, str]:
        headers = self.request.headers  # type: ignore[attr-defined]
        return {k.lower(): v for k, v in headers.items()}

    async def relay_messages(self, *, count_tokens: bool = False) -> None:
        origin = self.relay_caller.origin
        try:
            response = await self._proxy().messages(origin, self.request.body, self._query(),  # type: ignore[attr-defined]
                                                    self._client_headers(), count_tokens=count_tokens)
        except ProxyError as exc:
            await self._write_refusal(exc)
            return
        await self._write(response)

    async def relay_models(self) -> None:
        try:
            response = await self._proxy().models(self.relay_caller.origin, self._query(), self._client_headers())
        except ProxyError as exc:
            await self._write_refusal(exc)
            return
        await self._write(response)

    async def _write_refusal(self, exc: ProxyError) -> None:
        self.set_status(exc.status)  # type: ignore[attr-defined]
        self.set_header("Content-Type", "application/json")  # type: ignore[attr-defined]
        for name, value in exc.headers().items():
            self.set_header(name, value)  # type: ignore[attr-defined]
        self.finish(exc.body())  # type: ignore[attr-defined]

    async def _write(self, response: Any) -> None:
        self.set_status(response.status)  # type: ignore[attr-defined]
        for name, value in response.headers.items():
            self.set_header(name, value)  # type: ignore[attr-defined]
        if response.streaming:
            self.set_header("Cache-Control", "no-cache")  # type: ignore[attr-defined]
            stream = self.request.connection.stream  # type: ignore[attr-defined]
            if stream is not None:
                stream.set_nodelay(True)  # deltas go out as they come (Nagle adds ~20 ms to small frames, measured on loopback)
        chunks = response.chunks
        try:
            async for chunk in chunks:
                self.write(chunk)  # type: ignore[attr-defined]
                if response.streaming:
                    await self.flush()  # type: ignore[attr-defined]
        except StreamClosedError:
            await chunks.aclose()  # the client went away: the generator settles the reservation
            return
        except ProxyError as exc:  # mid-stream: the bytes already sent stand; end with an SSE error event
            await chunks.aclose()
            if response.streaming:
                self.write(b"event: error\ndata: " + exc.body() + b"\n\n")  # type: ignore[attr-defined]
            else:
                self.clear()  # type: ignore[attr-defined]
                await self._write_refusal(exc)
                return
        try:
            self.finish()  # type: ignore[attr-defined]
        except StreamClosedError:
            pass
