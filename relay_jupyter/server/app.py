"""The Jupyter server extension: ``RelayApp`` builds the broker from ``c.RelayApp.*`` and mounts the
relay handlers under ``{base_url}relay/``.

Enabled on install by ``jupyter-config/server-config/relay_jupyter.json`` (shared-data to
``etc/jupyter/jupyter_server_config.d``); see docs/architecture.md for editable installs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from tornado.ioloop import PeriodicCallback

from ..broker.assembly import install_components, start_components, stop_components
from ..broker.broker import Broker
from ..broker.config import BrokerConfig
from ..core.errors import ConfigRefusal
from ..broker.kernel_bridge import end_kernel
from ..broker.anthropic_proxy import AnthropicProxy
from ..broker.openai_proxy import OpenAIProxy
from .anthropic_handlers import anthropic_handlers
from .openai_handlers import openai_handlers
from .mcp_gateway import mcp_gateway_handlers
from .mcp_oauth_handler import mcp_oauth_handlers
from .handlers import relay_handlers
from .kernel_auth import KernelCredentials, install_kernel_env_hook, install_kernel_lifecycle_hook
from .settings import broker_config_of, setting_traits

__all__ = ["RelayApp"]


def _route_relay_logs(server_log: logging.Logger) -> None:
    """relay's module loggers (``relay_jupyter.*``) write through the Jupyter server's handlers at its level:
    the server's format and ``--debug`` apply, instead of Python's bare last-resort output."""
    relay_log = logging.getLogger("relay_jupyter")
    for handler in server_log.handlers:
        if handler not in relay_log.handlers:
            relay_log.addHandler(handler)
    relay_log.setLevel(server_log.getEffectiveLevel())
    relay_log.propagate = not server_log.handlers

_PRUNE_EVERY_MS = 3_600_000
_log = logging.getLogger(__name__)


class RelayApp(ExtensionApp):
    """relay-jupyter: the broker (enforcement boundary) inside the Jupyter server."""

    name = "relay_jupyter"
    description = "A safe AI agent in Jupyter: the broker that gates every tool call."
    load_other_extensions = True

    def _config_file_name_default(self) -> str:
        # jupyter_relay_config.{py,json}: the name the standalone daemon reads too (server/jupyter_config.py)
        return "jupyter_relay_config"

    # every broker setting, c.RelayApp.<name>: one trait each, defined in server/settings.py, where the daemon
    # reads the same section without importing this module (jupyter_server); a class body's locals() is its namespace
    locals().update(setting_traits())

    def broker_config(self) -> BrokerConfig:
        """The traitlets as a validated :class:`BrokerConfig` (``server/settings.py: broker_config_of``)."""
        return broker_config_of(self)

    def _secret_values(self) -> list[str]:
        values = self.broker.config.secret_values()
        token = getattr(self.serverapp.identity_provider, "token", "") or ""
        if token:
            values.append(token)
        names = {n.upper() for n in self.broker.config.secret_env_vars}
        values += [v for k, v in os.environ.items() if k.upper() in names and v]
        return values

    def _relay_url(self) -> str:
        return url_path_join(self.serverapp.connection_url, "relay/")

    def initialize_settings(self) -> None:
        """Build the broker and hook kernel starts (credential + scrubbed environment).

        A configuration the broker refuses (a model URL outside the endpoint policy, an unsafe secrets
        file, ...) stops the server with one line naming the setting: failing closed, not a server
        whose agent silently does not work (or sends a key in clear text)."""
        _route_relay_logs(self.serverapp.log)
        if self._init_thin_client():
            return
        try:
            self.broker = Broker.open(self.broker_config())
            install_components(self.broker, jupyter_root=Path(self.serverapp.root_dir))
        except ConfigRefusal as exc:
            self.log.critical("relay: %s [%s]", exc.message, exc.code.value)
            raise SystemExit(2) from None
        _log.debug("relay: broker open for the Jupyter root %s", self.serverapp.root_dir)
        self.kernel_credentials = KernelCredentials()
        self.anthropic_proxy = AnthropicProxy(self.broker)
        self.openai_proxy = OpenAIProxy(self.broker)
        self.settings.update({"relay_broker": self.broker, "relay_kernel_credentials": self.kernel_credentials,
                              "relay_anthropic_proxy": self.anthropic_proxy, "relay_openai_proxy": self.openai_proxy})
        install_kernel_env_hook(
            self.serverapp.kernel_manager, self.kernel_credentials,
            relay_url=self._relay_url,
            secret_names=lambda: self.broker.config.secret_env_vars,
            secret_values=self._secret_values,
        )
        # a kernel that restarts, shuts down or dies: its runs end and its consent cards are withdrawn
        install_kernel_lifecycle_hook(self.serverapp.kernel_manager, self._kernel_ended)
        self._pruner = PeriodicCallback(self.broker.prune_events, _PRUNE_EVERY_MS)
        self._pruner.start()
        self._publish_for_cli()
        self.log.info("relay-jupyter broker ready at %srelay/", self.serverapp.base_url)

    def _publish_for_cli(self) -> None:
        """A log file and a state file, so ``jupyter relay logs|status`` find this broker (server/server_state.py)."""
        if self.broker.config.in_memory:
            return
        from ..storage.paths import data_dir
        from .server_state import publish

        root = Path(self.broker.config.data_dir) if self.broker.config.data_dir else data_dir()
        try:
            publish(root, self.serverapp.connection_url, self.serverapp.log.getEffectiveLevel())
        except OSError as exc:  # the broker works without it; say why the CLI will not see its log
            self.log.warning("relay: cannot write relay's log file or state file for the CLI: %s", exc)

    def _init_thin_client(self) -> bool:
        """On a JupyterHub with the relay service: no broker here; kernels get the service's URL and the
        user's hub token (server/hub_service.py). False when no service is configured."""
        from .hub_service import ThinKernels, install_thin_kernel_env_hook, thin_client_url

        try:
            url = thin_client_url(self.hub_service_url)
        except ConfigRefusal as exc:
            self.log.critical("relay: %s [%s]", exc.message, exc.code.value)
            raise SystemExit(2) from None
        if url is None:
            return False
        self.thin_client_url = url
        token = getattr(self.serverapp.identity_provider, "token", "") or ""
        secret_values = [v for v in (token, self.anthropic_api_key, self.openai_api_key) if v]
        hub_token = lambda: os.environ.get("JUPYTERHUB_API_TOKEN")  # noqa: E731
        # a kernel that restarts, shuts down or dies: the service cancels its runs, withdraws its cards
        self.thin_kernels = ThinKernels(url, hub_token)
        install_thin_kernel_env_hook(
            self.serverapp.kernel_manager, url, token=hub_token,
            secret_names=self.secret_env_vars, secret_values=lambda: secret_values, kernels=self.thin_kernels)
        install_kernel_lifecycle_hook(self.serverapp.kernel_manager, self.thin_kernels.ended)
        self.log.info("relay-jupyter: thin client of the JupyterHub service at %s (no broker in this server)", url)
        return True

    def _kernel_ended(self, kernel_id: str, reason: str) -> None:
        ended = end_kernel(self.broker, f"kernel:{kernel_id}", reason)
        if ended["withdrawn"] or ended["cancelled_runs"]:
            self.log.info("relay: kernel %s %s: %d run(s) cancelled, %d permission request(s) withdrawn",
                          kernel_id, reason, len(ended["cancelled_runs"]), len(ended["withdrawn"]))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Connect MCP servers in the background: a slow server must not delay Jupyter's start."""
        if getattr(self, "broker", None) is None:  # a thin client of the hub service: nothing to start
            return
        from ..broker.mcp_signin import enable_mcp_sign_in
        from ..mcp.signin import REDIRECT_PATH

        # OAuth sign-in for HTTP MCP servers: the redirect lands on this server (docs/mcp.md)
        enable_mcp_sign_in(self.broker, url_path_join(serverapp.connection_url, REDIRECT_PATH))
        self._mcp_start = asyncio.ensure_future(start_components(self.broker))

    def initialize_handlers(self) -> None:
        """Mount the relay endpoints under ``{base_url}relay/`` (none in a thin client: the hub service serves them)."""
        if getattr(self, "thin_client_url", None):
            # the side panel's two routes, passed on to the hub service with the user's hub token
            from .hub_panel_proxy import panel_proxy_handlers

            self.handlers.extend(panel_proxy_handlers(self.thin_client_url,
                                                      lambda: os.environ.get("JUPYTERHUB_API_TOKEN")))
            return
        self.handlers.extend(relay_handlers() + anthropic_handlers() + openai_handlers())
        self.handlers.extend(mcp_gateway_handlers())  # relay/mcp: the gated MCP gateway (docs/mcp.md)
        self.handlers.extend(mcp_oauth_handlers())  # relay/mcp-oauth/callback: MCP OAuth sign-in lands here

    async def stop_extension(self) -> None:
        """Deny pending permission requests and close storage."""
        pruner: Any = getattr(self, "_pruner", None)
        if pruner is not None:
            pruner.stop()
        for attr in ("anthropic_proxy", "openai_proxy"):
            proxy: AnthropicProxy | OpenAIProxy | None = getattr(self, attr, None)
            if proxy is not None:
                await proxy.aclose()
        thin = getattr(self, "thin_kernels", None)
        if thin is not None:  # the kernel.ended messages still being sent to the hub service
            await thin.drain()
        broker: Broker | None = getattr(self, "broker", None)
        if broker is not None:
            from ..broker.mcp_gateway import mcp_gateway_of

            await mcp_gateway_of(broker).aclose()  # revokes every gateway token, stops its loopback listener
            await stop_components(broker)
            broker.close()
