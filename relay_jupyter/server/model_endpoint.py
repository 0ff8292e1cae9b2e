"""What the model endpoints' HTTP side shares (``relay/anthropic/v1/...`` and ``relay/openai/v1/...``): a tornado
mixin independent of how the caller is authenticated, parameterised by the wire's error shape.

A subclass names its proxy (``proxy_setting``, ``proxy_class``) and its error format (:meth:`error_body`,
:meth:`stream_error`). Refusals before anything is written are the wire's error body; a failure after the
stream began (a cut answer, an oversized event) ends the stream with the wire's own error event, which the
official SDKs raise on.
"""

from __future__ import annotations

from typing import Any

from tornado.iostream import StreamClosedError

from ..broker.model_proxy import MAX_BODY_BYTES, ProxyError

__all__ = ["ModelEndpoint", "proxy_credential"]


def proxy_credential(headers: Any) -> str:
    """The credential an SDK client sends: ``x-api-key``, else ``Authorization: Bearer``."""
    key = headers.get("x-api-key", "").strip()
    if key:
        return key
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


class ModelEndpoint:
    """Transport-neutral: needs ``self.relay_caller`` (set by the auth base) and ``settings["relay_broker"]``."""

    relay_caller: Any
    #: tornado settings key of the shared proxy, and its class (built on first use when absent)
    proxy_setting = ""
    proxy_class: Any = None
    #: how a refused client should send its credential (the 401 message)
    credential_hint = "send your relay credential as the API key"

    # -- the wire's error format ---------------------------------------------------------------------
    def error_body(self, error_type: str, message: str, code: str | None = None) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def refusal_body(self, exc: ProxyError) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def stream_error(self, exc: ProxyError) -> bytes:  # pragma: no cover
        """The bytes that end a stream with ``exc``."""
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------------------
    def _proxy(self) -> Any:
        settings = self.settings  # type: ignore[attr-defined]
        proxy = settings.get(self.proxy_setting)
        if proxy is None:
            proxy = settings[self.proxy_setting] = self.proxy_class(settings["relay_broker"])
        return proxy

    def _refuse_early(self, status: int, error_type: str, message: str) -> None:
        """Answer now (from ``prepare``) with the wire's error body."""
        self.set_status(status)  # type: ignore[attr-defined]
        self.set_header("Content-Type", "application/json")  # type: ignore[attr-defined]
        self.finish(self.error_body(error_type, message))  # type: ignore[attr-defined]

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
        self.finish(self.error_body(kinds.get(status_code, "api_error"), str(reason)))  # type: ignore[attr-defined]

    def _query(self) -> dict[str, str]:
        args = self.request.query_arguments  # type: ignore[attr-defined]
        return {k: v[-1].decode("utf-8", "replace") for k, v in args.items() if v}

    def _client_headers(self) -> dict[str, str]:
        headers = self.request.headers  # type: ignore[attr-defined]
        return {k.lower(): v for k, v in headers.items()}

    async def _answer(self, call: Any) -> None:
        """Await ``call()`` (a proxy method) and write its response or its refusal."""
        try:
            response = await call()
        except ProxyError as exc:
            await self._write_refusal(exc)
            return
        await self._write(response)

    async def _write_refusal(self, exc: ProxyError) -> None:
        self.set_status(exc.status)  # type: ignore[attr-defined]
        self.set_header("Content-Type", "application/json")  # type: ignore[attr-defined]
        for name, value in exc.headers().items():
            self.set_header(name, value)  # type: ignore[attr-defined]
        self.finish(self.refusal_body(exc))  # type: ignore[attr-defined]

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
        except ProxyError as exc:  # mid-stream: the bytes already sent stand; end with the wire's error event
            await chunks.aclose()
            if response.streaming:
                self.write(self.stream_error(exc))  # type: ignore[attr-defined]
            else:
                self.clear()  # type: ignore[attr-defined]
                await self._write_refusal(exc)
                return
        try:
            self.finish()  # type: ignore[attr-defined]
        except StreamClosedError:
            pass
