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

from ..broker.anthropic_proxy import AnthropicProxy, ProxyError, anthropic_error_body
from .model_endpoint import ModelEndpoint, proxy_credential

__all__ = ["ANTHROPIC_PATHS", "AnthropicEndpoint", "proxy_credential"]

#: Paths under the relay prefix, and the verb each answers.
ANTHROPIC_PATHS = {"anthropic/v1/messages": "POST", "anthropic/v1/messages/count_tokens": "POST",
                   "anthropic/v1/models": "GET"}


class AnthropicEndpoint(ModelEndpoint):
    """Transport-neutral: needs ``self.relay_caller`` (set by the auth base) and ``settings["relay_broker"]``."""

    proxy_setting = "relay_anthropic_proxy"
    proxy_class = AnthropicProxy
    credential_hint = "send this kernel's RELAY_KERNEL_CREDENTIAL as the API key (x-api-key)"

    def error_body(self, error_type: str, message: str, code: str | None = None) -> bytes:
        return anthropic_error_body(error_type, message, code)

    def refusal_body(self, exc: ProxyError) -> bytes:
        return exc.body()

    def stream_error(self, exc: ProxyError) -> bytes:
        return b"event: error\ndata: " + exc.body() + b"\n\n"

    async def relay_messages(self, *, count_tokens: bool = False) -> None:
        origin = self.relay_caller.origin
        await self._answer(lambda: self._proxy().messages(origin, self.request.body, self._query(),  # type: ignore[attr-defined]
                                                          self._client_headers(), count_tokens=count_tokens))

    async def relay_models(self) -> None:
        await self._answer(lambda: self._proxy().models(self.relay_caller.origin, self._query(),
                                                        self._client_headers()))
