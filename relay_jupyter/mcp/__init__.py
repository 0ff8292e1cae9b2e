"""relay_jupyter.mcp: the user's MCP servers as gated tools (docs/gate.md, docs/mcp.md).

- :mod:`.config` parses ``mcp.json`` (Claude Desktop format); :mod:`.policy` is the endpoint policy;
- :mod:`.connection` is one supervised server (stdio via :mod:`.stdio`, Streamable HTTP via :mod:`.http`);
- :mod:`.discovery` bounds listed tools and renders results; :mod:`.pins` binds classification pins to digests;
- :mod:`.registry` ties them together: ``McpRegistry(config, pins_store)``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import HttpServerConfig, McpConfig, StdioServerConfig, load_config, parse_config
    from .connection import SUPPORTED_PROTOCOL_VERSIONS, McpConnection, McpToolError
    from .pins import PinBook, PinStore
    from .policy import check_endpoint, check_headers
    from .registry import McpRegistry, ServerStatus

# The names below are imported on first use (PEP 562), not with the package: importing any submodule imports this
# package first, and ``.connection`` / ``.registry`` import the MCP SDK (about 1.3 s of CPU). The broker's settings
# import ``.policy`` (broker/config.py) and the daemon's start needs nothing else of MCP when no server is
# configured, so eager imports here made every daemon start pay for the SDK (issue 19, benchmarks/README.md
# "Daemon start"; tests/daemon/test_daemon_start_imports.py).
_LAZY = {
    "HttpServerConfig": ".config", "McpConfig": ".config", "StdioServerConfig": ".config", "load_config": ".config",
    "parse_config": ".config",
    "SUPPORTED_PROTOCOL_VERSIONS": ".connection", "McpConnection": ".connection", "McpToolError": ".connection",
    "PinBook": ".pins", "PinStore": ".pins",
    "check_endpoint": ".policy", "check_headers": ".policy",
    "McpRegistry": ".registry", "ServerStatus": ".registry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
