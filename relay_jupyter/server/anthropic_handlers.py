"""The Anthropic-compatible endpoint inside the Jupyter server: a kernel's own credential is its API key.

``x-api-key: <RELAY_KERNEL_CREDENTIAL>`` or ``Authorization: Bearer <...>`` -> the kernel -> its notebook
(origin ``notebook:<path>``), as for RPC. Nothing else opens it (no Jupyter token, no cookie); a missing or
wrong credential is the Messages API's 401 ``authentication_error`` body.
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .anthropic_endpoint import AnthropicEndpoint, proxy_credential
from .handlers import RelayJupyterHandler

__all__ = ["AnthropicCountTokensHandler", "AnthropicMessagesHandler", "AnthropicModelsHandler", "ProxyAuth",
           "anthropic_handlers"]


class ProxyAuth(RelayJupyterHandler):
    """Kernel credential as an SDK's API key; anything else is a 401 in the wire's error shape (the model
    endpoint mixin before this class in the MRO gives ``_refuse_early`` and ``credential_hint``)."""

    credential_hint: str

    async def prepare(self) -> None:  # type: ignore[override]
        credential = proxy_credential(self.request.headers)
        if not credential:
            self._refuse_early(401, "authentication_error", self.credential_hint)
            return
        try:
            await self._prepare_kernel(credential)
        except web.HTTPError as exc:
            if exc.status_code == 403 and exc.log_message == "invalid kernel credential":
                self._refuse_early(401, "authentication_error", "invalid kernel credential")
                return
            raise
        self.check_body_size()


class AnthropicMessagesHandler(AnthropicEndpoint, ProxyAuth):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self.relay_messages()


class AnthropicCountTokensHandler(AnthropicEndpoint, ProxyAuth):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self.relay_messages(count_tokens=True)


class AnthropicModelsHandler(AnthropicEndpoint, ProxyAuth):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.relay_models()


def anthropic_handlers() -> list[tuple[str, type[web.RequestHandler]]]:
    """Routes relative to the server's base_url."""
    return [
        (r"/relay/anthropic/v1/messages", AnthropicMessagesHandler),
        (r"/relay/anthropic/v1/messages/count_tokens", AnthropicCountTokensHandler),
        (r"/relay/anthropic/v1/models", AnthropicModelsHandler),
    ]


_ProxyAuth = ProxyAuth  # the name before the OpenAI-compatible endpoint shared it
