"""relay_jupyter.mcp: the user's MCP servers as gated tools (docs/gate.md, docs/mcp.md).

- :mod:`.config` parses ``mcp.json`` (Claude Desktop format); :mod:`.policy` is the endpoint policy;
- :mod:`.connection` is one supervised server (stdio via :mod:`.stdio`, Streamable HTTP via :mod:`.http`);
- :mod:`.discovery` bounds listed tools and renders results; :mod:`.pins` binds classification pins to digests;
- :mod:`.registry` ties them together: ``McpRegistry(config, pins_store)``.
"""

from __future__ import annotations

from .config import HttpServerConfig, McpConfig, StdioServerConfig, load_config, parse_config
from .connection import SUPPORTED_PROTOCOL_VERSIONS, McpConnection, McpToolError
from .pins import PinBook, PinStore
from .policy import check_endpoint, check_headers
from .registry import McpRegistry, ServerStatus

__all__ = [
    "SUPPORTED_PROTOCOL_VERSIONS",
    "HttpServerConfig",
    "McpConfig",
    "McpConnection",
    "McpRegistry",
    "McpToolError",
    "PinBook",
    "PinStore",
    "ServerStatus",
    "StdioServerConfig",
    "check_endpoint",
    "check_headers",
    "load_config",
    "parse_config",
]
