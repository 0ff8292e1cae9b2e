"""``{base_url}relay/mcp``: the gated MCP gateway mounted in the Jupyter server (logic and the handler in
:mod:`relay_jupyter.broker.mcp_gateway`; docs/mcp.md, "The gated MCP gateway").

Who may call: the holder of a gateway token for one origin (``Authorization: Bearer``), minted by the
broker (:meth:`~relay_jupyter.broker.mcp_gateway.McpGateway.session`). Not Jupyter's login: the handler is a
plain tornado handler, so neither a Jupyter token nor a browser cookie opens it, and a page in another
origin is refused (``Origin`` check) before its token is even looked at.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.utils import url_path_join
from tornado.web import RequestHandler

from ..broker.mcp_gateway import GatewayHandler, McpGateway, mcp_gateway_of

__all__ = ["JupyterGatewayHandler", "gateway_url", "mcp_gateway_handlers"]


class JupyterGatewayHandler(GatewayHandler):
    """The broker-level handler, finding the gateway of the server's broker (``settings["relay_broker"]``)."""

    def initialize(self, **_: Any) -> None:
        self.gateway: McpGateway = mcp_gateway_of(self.settings["relay_broker"])


def gateway_url(connection_url: str) -> str:
    """The gateway's URL under a Jupyter server's ``connection_url`` (``http://127.0.0.1:8888/relay/mcp``)."""
    return url_path_join(connection_url, "relay/mcp")


def mcp_gateway_handlers() -> list[tuple[str, type[RequestHandler]]]:
    """Routes relative to the server's base_url."""
    return [(r"/relay/mcp", JupyterGatewayHandler)]
