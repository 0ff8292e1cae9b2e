"""The OpenAI-compatible endpoint inside the Jupyter server: a kernel's own credential is its API key.

``Authorization: Bearer <RELAY_KERNEL_CREDENTIAL>`` (what the ``openai`` SDK sends; ``x-api-key`` works too)
-> the kernel -> its notebook (origin ``notebook:<path>``), as for RPC and the Anthropic endpoint. Nothing else
opens it (no Jupyter token, no cookie); a missing or wrong credential is a 401 with OpenAI's error shape.
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .anthropic_handlers import ProxyAuth
from .openai_endpoint import OpenAIEndpoint

__all__ = ["OpenAIChatCompletionsHandler", "OpenAIModelsHandler", "openai_handlers"]


class OpenAIChatCompletionsHandler(OpenAIEndpoint, ProxyAuth):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self.relay_chat_completions()


class OpenAIModelsHandler(OpenAIEndpoint, ProxyAuth):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.relay_models()


def openai_handlers() -> list[tuple[str, type[web.RequestHandler]]]:
    """Routes relative to the server's base_url."""
    return [
        (r"/relay/openai/v1/chat/completions", OpenAIChatCompletionsHandler),
        (r"/relay/openai/v1/models", OpenAIModelsHandler),
    ]
