"""The relay endpoints inside the Jupyter server: Jupyter auth, or a kernel's own credential.

Every verb carries ``@web.authenticated`` and ``@authorized`` (auth resource ``relay``). Who is calling:

- ``Authorization: RelayKernel <credential>``: a kernel started by this server. The credential maps to
  the kernel id, the kernel id to its notebook path (the session manager): origin
  ``notebook:<path>``, client id ``kernel:<kernel_id>``. A wrong or stale credential is refused (403)
  and never falls back to anything else. XSRF does not apply (a custom Authorization header cannot
  be sent cross-site without a CORS preflight, which Jupyter refuses); Host and Origin checks still do.
- anything else: Jupyter's own identity (token, cookie + XSRF, origin checks): a browser session of
  the server's user, client id ``browser:<user>:<X-Relay-Client or "default">``.
"""

from __future__ import annotations

import re
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.auth.identity import User
from jupyter_server.base.call_context import CallContext
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..core.caller import Caller, CallerKind
from .endpoints import EventsEndpoint, HealthEndpoint, MetricsEndpoint, ReadyEndpoint, RpcEndpoint
from .kernel_auth import AUTH_SCHEME, KernelCredentials

__all__ = [
    "AUTH_RESOURCE",
    "EventsHandler",
    "HealthzHandler",
    "MetricsHandler",
    "ReadyzHandler",
    "RelayJupyterHandler",
    "RpcHandler",
    "relay_handlers",
]

AUTH_RESOURCE = "relay"
_CLIENT_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


async def kernel_origin(serverapp: Any, kernel_id: str) -> str:
    """``notebook:<path>`` of the kernel's session, or ``kernel:<id>`` for a kernel without one."""
    try:
        session = await serverapp.session_manager.get_session(kernel_id=kernel_id)
    except web.HTTPError:  # get_session raises HTTPError(404) when there is no session
        session = None
    path = (session or {}).get("path")
    return f"notebook:{path}" if path else f"kernel:{kernel_id}"


class RelayJupyterHandler(APIHandler):
    """Auth base of every relay handler in the Jupyter server."""

    auth_resource = AUTH_RESOURCE
    relay_caller: Caller | None = None

    @property
    def relay_credentials(self) -> KernelCredentials:
        return self.settings["relay_kernel_credentials"]

    async def prepare(self) -> None:  # type: ignore[override]
        header = self.request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == AUTH_SCHEME.lower():
            await self._prepare_kernel(value.strip())
            return
        await super().prepare()
        user = self.current_user
        if user is not None:
            client = self.request.headers.get("X-Relay-Client", "default")
            if not _CLIENT_NAME.match(client):
                raise web.HTTPError(400, "X-Relay-Client must be 1-64 of [A-Za-z0-9_.:-]")
            self.relay_caller = Caller(kind=CallerKind.BROWSER, origin=None,
                                       client_id=f"browser:{user.username}:{client}", user=user.username)

    async def _prepare_kernel(self, credential: str) -> None:
        # The parts of JupyterHandler.prepare / APIHandler.prepare that still apply to a kernel.
        CallContext.set(CallContext.JUPYTER_HANDLER, self)
        if not self.check_host():
            raise web.HTTPError(403)
        kernel_id = self.relay_credentials.resolve(credential)
        kernel_manager = self.settings["kernel_manager"]
        if kernel_id is not None and kernel_id not in kernel_manager:
            self.relay_credentials.revoke(kernel_id)  # the kernel is gone: so is its credential
            kernel_id = None
        if kernel_id is None:
            self.current_user = self._jupyter_current_user = None
            raise web.HTTPError(403, "invalid kernel credential")
        origin = await kernel_origin(self.settings["serverapp"], kernel_id)
        user = User(username=f"relay-kernel-{kernel_id}", name="relay kernel")
        self.current_user = self._jupyter_current_user = user
        self.relay_caller = Caller(kind=CallerKind.KERNEL, origin=origin, client_id=f"kernel:{kernel_id}")
        self.set_cors_headers()
        if not self.check_origin():
            raise web.HTTPError(404)

    def finish(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        # APIHandler.finish forces application/json; keep text/event-stream and Prometheus text
        kwargs.setdefault("set_content_type", self._headers.get("Content-Type", "application/json"))
        return super().finish(*args, **kwargs)


@web.stream_request_body
class RpcHandler(RelayJupyterHandler, RpcEndpoint):
    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        self.relay_prepare_body()

    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self.relay_post()


class EventsHandler(RelayJupyterHandler, EventsEndpoint):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.relay_get()


class HealthzHandler(RelayJupyterHandler, HealthEndpoint):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.relay_get()


class ReadyzHandler(RelayJupyterHandler, ReadyEndpoint):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.relay_get()


class MetricsHandler(RelayJupyterHandler, MetricsEndpoint):
    @web.authenticated
    @authorized
    def get(self) -> None:
        self.relay_get()


def relay_handlers() -> list[tuple[str, type[web.RequestHandler]]]:
    """Routes relative to the server's base_url (the ExtensionApp prefixes it)."""
    return [
        (r"/relay/rpc", RpcHandler),
        (r"/relay/events", EventsHandler),
        (r"/relay/healthz", HealthzHandler),
        (r"/relay/readyz", ReadyzHandler),
        (r"/relay/metrics", MetricsHandler),
    ]
