"""``relay/openai/v1/...``: the OpenAI-compatible endpoint's HTTP side (logic in
:mod:`relay_jupyter.broker.openai_proxy`), a tornado mixin independent of how the caller is authenticated:
``server/openai_handlers.py`` inside Jupyter (a kernel's own credential as ``Authorization: Bearer``, what
the ``openai`` SDK sends), ``server/plain.py`` in the daemon (its token, or the Unix socket).

Every error is OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``, with the relay code as
``code`` and at the end of the message; a stream that relay ends after it began ends with a ``data:`` line
holding such an error object (the ``openai`` SDK raises ``APIError`` on it) and no ``[DONE]``.
"""

from __future__ import annotations

from ..broker.model_proxy import ProxyError, openai_error_body
from ..broker.openai_proxy import OpenAIProxy
from .model_endpoint import ModelEndpoint

__all__ = ["OPENAI_PATHS", "OpenAIEndpoint"]

#: Paths under the relay prefix, and the verb each answers.
OPENAI_PATHS = {"openai/v1/chat/completions": "POST", "openai/v1/models": "GET"}


class OpenAIEndpoint(ModelEndpoint):
    """Transport-neutral: needs ``self.relay_caller`` (set by the auth base) and ``settings["relay_broker"]``."""

    proxy_setting = "relay_openai_proxy"
    proxy_class = OpenAIProxy
    credential_hint = "send this kernel's RELAY_KERNEL_CREDENTIAL as the API key (Authorization: Bearer)"

    def error_body(self, error_type: str, message: str, code: str | None = None) -> bytes:
        return openai_error_body(error_type, message, code)

    def refusal_body(self, exc: ProxyError) -> bytes:
        return exc.openai_body()

    def stream_error(self, exc: ProxyError) -> bytes:
        return b"data: " + exc.openai_body() + b"\n\n"

    async def relay_chat_completions(self) -> None:
        origin = self.relay_caller.origin
        await self._answer(lambda: self._proxy().chat_completions(origin, self.request.body,  # type: ignore[attr-defined]
                                                                  self._client_headers()))

    async def relay_models(self) -> None:
        await self._answer(lambda: self._proxy().models(self.relay_caller.origin, self._client_headers()))
