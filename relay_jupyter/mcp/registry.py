"""The MCP registry: the user's MCP servers, their tools, classified, callable through the gate.

``McpRegistry(config, pins_store)`` connects every enabled server of ``mcp.json`` at
``start()``, lists and bounds their tools (``discovery``), and exposes them as
:class:`~relay_jupyter.core.types.ToolSpec` named ``server__tool``. Each spec's class is
computed on every ``specs()`` call: ``write`` unless a pin whose digest still matches says
otherwise, then made stricter (never looser) by the tool's MCP annotations
(``core.classify.classify``). The registry never decides whether a call may run: the gate does.

A server that fails to start is reported in :meth:`McpRegistry.status` and tried again on the
next call to one of its tools. A server that hangs, dies or floods during a call is stopped;
the call fails with :class:`McpToolError` (no retry) and the next call starts it again. If the
server's tool changed meanwhile (a new digest), that call is refused with ``DIGEST_MISMATCH``:
the consent given was for the old tool.

The registry is a :class:`~relay_jupyter.core.tooling.ToolSource` (its ``tool_*`` methods): the
executor re-lists the tool before every call (:meth:`McpRegistry.tool_current`), binds the consent to
its digest and annotations (:meth:`McpRegistry.tool_preflight`) and has :meth:`McpRegistry.call`
re-check both at the call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import urlsplit

from ..core.classify import classify
from ..core.errors import Code, ConfigRefusal, RoutingRefusal
from ..core.tooling import Preflight, ToolContext, ToolResult, as_result
from ..core.types import ToolClass, ToolSpec
from .config import HttpServerConfig, McpConfig, ServerConfig, StdioServerConfig
from .connection import McpConnection, McpToolError
from .discovery import DEFAULT_MAX_OUTPUT_BYTES, DiscoveredTool, convert_tools, split_name
from .elicitation import call_context
from .oauth import MemoryTokenStore, client_credentials_provider
from .pins import PinBook, PinStore
from .stdio import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["McpRegistry", "ServerStatus"]

logger = logging.getLogger(__name__)

#: An approved call (``expected_digest``) re-lists its server first when the last listing is older
#: than this many seconds: a consent card may have been open for minutes, and a tool changed silently
#: meanwhile must not run under the approval given for the old one.
RELIST_AFTER = 1.0


@dataclass
class ServerStatus:
    """What the registry knows about one configured server (shown by ``jupyter relay tools list``)."""

    name: str
    transport: str
    source: str
    state: str
    """``connected`` | ``failed`` | ``stopped`` | ``disabled`` | ``invalid``."""
    error: str | None = None
    protocol_version: str | None = None
    tools: int = 0
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class _Server:
    config: ServerConfig
    connection: McpConnection
    tools: dict[str, DiscoveredTool] = field(default_factory=dict)
    error: str | None = None
    error_reason: str | None = None
    """``McpToolError.reason`` of the last failure (``auth``: a 401/403; the side panel's sign-in list)."""
    problems: list[str] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    listed_at: float = 0.0
    """``time.monotonic()`` of the last successful ``tools/list``."""
    token_mtime: float = 0.0
    """The OAuth token file's mtime when the server was last connected (``_retry_signed_in``)."""
    retry: asyncio.Task[bool] | None = None
    has_resources: bool | None = None
    """The server announced ``resources`` and listed at least one (checked once per connection): relay then
    offers ``<server>__list_resources`` / ``<server>__read_resource``."""


class _ClientCredentials:
    """``McpConnection.http_auth`` of a machine client: the SDK's ``client_credentials`` provider per connection,
    the secret looked up at each connect, the tokens in memory for the registry's life (one token, reused)."""

    def __init__(self, config: HttpServerConfig, secret_of: Callable[[str], Any]) -> None:
        self.config, self.secret_of = config, secret_of
        self.store = MemoryTokenStore()

    def __call__(self, config: HttpServerConfig) -> Any:
        entry = config.secret_entry
        try:
            secret = self.secret_of(entry)
        except ConfigRefusal as exc:  # the secrets file is unsafe or unreadable: its message never holds a value
            raise McpToolError(config.name, "auth", f"MCP server {config.name!r}: {exc.message}") from None
        value = secret.reveal() if secret is not None else ""
        if not value:
            raise McpToolError(config.name, "auth",
                               f"MCP server {config.name!r} is a machine client (client_id in mcp.json) but the relay "
                               f"secrets file (c.RelayApp.secrets_file) has no entry {entry!r} with its client "
                               + ("private key (PEM)" if config.token_auth == "private_key_jwt" else "secret"))
        return client_credentials_provider(config.url, self.store, client_id=config.client_id or "",
                                           client_secret=value, issuer=config.issuer or "", scope=config.scope,
                                           token_auth=config.token_auth, signing_algorithm=config.signing_algorithm)

    def __repr__(self) -> str:
        return f"_ClientCredentials({self.config.name!r}, <secret hidden>)"


class McpRegistry:
    """The broker's MCP tools. Use ``await start()`` / ``await stop()`` (or ``async with``)."""

    def __init__(
        self,
        config: McpConfig,
        pins_store: PinStore | None = None,
        *,
        call_timeout: float = 60.0,
        connect_timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        shutdown_grace: float = 2.0,
    ) -> None:
        self.config = config
        self.pins = PinBook(pins_store) if pins_store is not None else None
        self._servers: dict[str, _Server] = {
            name: _Server(
                config=cfg,
                connection=McpConnection(
                    cfg,
                    call_timeout=call_timeout,
                    connect_timeout=connect_timeout,
                    max_message_bytes=max_message_bytes,
                    max_output_bytes=max_output_bytes,
                    shutdown_grace=shutdown_grace,
                ),
            )
            for name, cfg in config.servers.items()
        }
        self._started = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect every enabled server concurrently and list its tools. Failures are recorded, not raised."""
        self._started = True
        if self._servers:
            # jsonschema (checking every listed schema) is imported on first use and takes seconds on a loaded
            # machine: import it in a worker thread, so the broker's loop (the daemon's RPC) is not stalled
            # when the first server lists its tools — at start, or later after a sign-in
            from .discovery import _jsonschema

            await asyncio.to_thread(_jsonschema)
        await asyncio.gather(*(self._connect(server) for server in self._servers.values()))

    async def stop(self) -> None:
        """Close every connection and stop every server process."""
        self._started = False
        await asyncio.gather(*(server.connection.close() for server in self._servers.values()))

    async def _connect(self, server: _Server, *, relist: bool = False) -> bool:
        """(Re)connect ``server`` and refresh its tools; record the error on failure.

        ``relist`` re-lists a live connection too (the per-call check of :meth:`current`). A server
        that went away under a live connection (it exited, or was restarted) is started again once
        and re-listed: a restart is never a way to keep an old tool list.
        """
        async with server.lock:
            if server.connection.connected and not server.connection.tools_changed and not relist:
                return True
            server.token_mtime = self._token_mtime(server)
            for attempt in (1, 2):
                was_connected = server.connection.connected
                try:
                    await server.connection.open()
                    listed = await server.connection.list_tools()
                    if not was_connected or server.has_resources is None:  # once per connection
                        server.has_resources = await _lists_resources(server.connection)
                    break
                except McpToolError as exc:
                    await server.connection.close(force=True)
                    if attempt == 1 and was_connected and exc.reason in ("exited", "closed"):
                        continue
                    server.error = exc.message
                    server.error_reason = exc.reason
                    server.tools = {}
                    logger.warning("MCP server %r unavailable: %s", server.config.name, exc.message)
                    return False
            found, problems = convert_tools(server.config.name, server.config.source, listed)
            if server.has_resources:
                found += _resource_tools(server.config.name, server.config.source, server.connection, found)
            server.listed_at = time.monotonic()
            server.tools = {tool.spec.name: tool for tool in found}
            server.problems = problems
            server.error = None
            server.error_reason = None
            return True

    async def refresh(self, server: str | None = None) -> None:
        """Re-list the tools of one server (or all): after ``tools/list_changed`` or a config reload."""
        names = [server] if server is not None else list(self._servers)
        for name in names:
            if name in self._servers:
                self._servers[name].connection.tools_changed = True
                await self._connect(self._servers[name])

    # -- OAuth sign-in (mcp/signin.py) -----------------------------------------------------------

    def enable_client_credentials(self, secret_of: Callable[[str], Any]) -> None:
        """Machine-to-machine servers (mcp.json ``client_id`` + ``issuer``): each connection gets the SDK's
        ``client_credentials`` provider with the client secret ``secret_of(entry)`` returns (a ``Secret`` from the
        relay secrets file, read at each connect; never logged, shown or stored elsewhere) and its tokens in memory.
        A missing secret fails that server with one line naming the entry."""
        for server in self._servers.values():
            cfg = server.config
            if isinstance(cfg, HttpServerConfig) and cfg.client_id is not None:
                server.connection.http_auth = _ClientCredentials(cfg, secret_of)

    def enable_sign_in(self, sign_in: Any) -> None:
        """Switch OAuth on for the HTTP servers that have no ``Authorization`` header in mcp.json: the SDK's
        provider (tokens in ``sign_in``'s 0600 store) on each connection; a server that needs a person
        fails at once with "needs sign-in" until :meth:`start_sign_in` is asked for it."""
        self.sign_in = sign_in
        for server in self._servers.values():
            cfg = server.config
            if isinstance(cfg, HttpServerConfig) and cfg.client_id is None \
                    and not any(k.lower() == "authorization" for k in cfg.headers):
                server.connection.http_auth = sign_in.provider_for
                server.connection.sign_in_hint = getattr(sign_in, "how_to", "").format(name=cfg.name) or None

    def _token_mtime(self, server: _Server) -> float:
        sign_in = getattr(self, "sign_in", None)
        cfg = server.config
        if sign_in is None or server.connection.http_auth is None or not isinstance(cfg, HttpServerConfig):
            return 0.0
        try:
            return sign_in.store(cfg.name, cfg.url).path.stat().st_mtime
        except OSError:
            return 0.0

    def _retry_signed_in(self) -> None:
        """A server that failed for want of a sign-in is connected again (in the background) once its token
        file changed: a sign-in made by another process (``jupyter relay mcp-signin`` next to the daemon).
        A stat per OAuth server per listing; the tools appear from the next listing on."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for server in self._servers.values():
            if server.error is None or server.connection.connected or server.retry is not None:
                continue
            mtime = self._token_mtime(server)
            if mtime and mtime != server.token_mtime:
                server.token_mtime = mtime

                def done(_task: Any, server: _Server = server) -> None:
                    server.retry = None

                server.retry = loop.create_task(self._connect(server))
                server.retry.add_done_callback(done)

    async def disconnect(self, name: str) -> None:
        """Close server ``name``'s connection (sign-out: a live session must not outlast the forgotten token)."""
        server = self._servers.get(name)
        if server is not None:
            async with server.lock:
                await server.connection.close(force=True)
                server.tools = {}

    def sign_ins(self) -> list[dict[str, Any]]:
        """The servers that sign in with OAuth here (HTTP, no ``Authorization`` header in mcp.json) and where each
        stands, for the side panel's "Sign in to <server>" list (RPC ``mcp.sign_ins``): ``state`` is
        ``needs_sign_in`` (its last connect was answered 401/403), ``pending`` (a sign-in is waiting for the
        person: its ``sign_in_id`` and the link), ``signed_in`` (connected), ``unavailable`` (failed for another
        reason: ``message``) or ``not_connected`` (not tried yet, or stopped). Never a token: only whether the
        broker holds one (``has_token``)."""
        sign_in = getattr(self, "sign_in", None)
        if sign_in is None:
            return []
        out: list[dict[str, Any]] = []
        for name, server in self._servers.items():
            cfg = server.config
            if server.connection.http_auth is None or not isinstance(cfg, HttpServerConfig) or cfg.client_id:
                continue  # a machine client (client_credentials) signs in by itself
            pending = sign_in.active(name)
            entry: dict[str, Any] = {"server": name, "host": urlsplit(cfg.url).hostname or "",
                                     "has_token": sign_in.store(cfg.name, cfg.url).has_tokens(),
                                     "message": "", "sign_in_id": None, "authorization_url": None}
            if pending is not None and pending.url.done() and not pending.url.cancelled() \
                    and pending.url.exception() is None:
                entry.update(state="pending", sign_in_id=pending.sign_in_id, authorization_url=pending.url.result(),
                             message="open the link to sign in")
            elif server.connection.connected:
                entry.update(state="signed_in", message=f"{len(server.tools)} tools")
            elif server.error is not None and server.error_reason == "auth":
                entry.update(state="needs_sign_in", message=server.error[:500])
            elif server.error is not None:
                entry.update(state="unavailable", message=server.error[:500])
            else:
                entry.update(state="not_connected")
            out.append(entry)
        return out

    async def start_sign_in(self, name: str, *, timeout: float = 600.0, url_wait: float = 30.0) -> Any:
        """Start signing in to ``name``: returns the :class:`~relay_jupyter.mcp.signin.SignInPending` once the
        SDK has the authorization URL for the card (``pending.url``), or once the connection ended without one
        (already signed in, or failed: ``pending.outcome``). The flow goes on in ``pending.task``, waiting up
        to ``timeout`` for the person.

        Raises:
            RoutingRefusal: ``NOT_FOUND`` (no such HTTP server with sign-in switched on).
        """
        sign_in = getattr(self, "sign_in", None)
        server = self._servers.get(name)
        if sign_in is None or server is None or server.connection.http_auth is None \
                or getattr(server.config, "client_id", None) is not None:
            raise RoutingRefusal(Code.NOT_FOUND, f"no HTTP MCP server named {name!r} signs in with OAuth here "
                                                 "(only servers with a url and no Authorization header in mcp.json)")
        pending = sign_in.begin(name)

        async def flow() -> None:
            conn = server.connection
            await conn.close(force=True)
            saved = conn.connect_timeout
            conn.connect_timeout = timeout  # the person's time, not the handshake's
            try:
                ok = await self._connect(server, relist=True)
            finally:
                conn.connect_timeout = saved
            if ok:
                sign_in.finish(pending, "signed_in", f"signed in to {name}: {len(server.tools)} tools")
            else:
                sign_in.finish(pending, "failed", server.error or "sign-in failed")

        pending.task = asyncio.ensure_future(flow())
        await asyncio.wait({pending.url, pending.task}, timeout=url_wait, return_when=asyncio.FIRST_COMPLETED)
        return pending

    # -- prompts (``%agent --prompt server:name``; issue 20 item 4) --------------------------------

    async def _connected(self, name: str) -> _Server:
        server = self._servers.get(name)
        if server is None:
            raise RoutingRefusal(Code.NOT_FOUND, f"no MCP server named {name!r} is configured (or it is disabled)")
        if not server.connection.connected and not await self._connect(server):
            raise McpToolError(server.config.name, "connect", server.error or "MCP server unavailable")
        return server

    def servers_named(self) -> list[str]:
        """The configured (enabled, valid) servers' names."""
        return list(self._servers)

    async def prompts(self, name: str) -> list[dict[str, Any]]:
        """The prompts server ``name`` lists (``McpConnection.list_prompts``: bounded, strings cut); [] when
        it does not announce ``prompts``.

        Raises:
            RoutingRefusal: ``NOT_FOUND`` (no such server).
            McpToolError: the server cannot be reached or hung (``TOOL_ERROR``).
        """
        return await (await self._connected(name)).connection.list_prompts()

    async def prompt(self, name: str, prompt: str, arguments: dict[str, str]) -> dict[str, Any]:
        """Fetch one prompt (``prompts/get``) with ``arguments``: ``{"messages": [{role, text}], "truncated"}``.
        The prompt must be one the server lists now, and every argument it marks ``required`` given; unknown
        argument names are refused (one line naming what it takes) before anything is sent.

        Raises:
            RoutingRefusal: ``NOT_FOUND`` (server or prompt), ``INVALID_ARGUMENTS``.
            McpToolError: ``TOOL_ERROR`` (unreachable, hung, or the server refused the request).
        """
        listed = {p["name"]: p for p in await self.prompts(name)}
        found = listed.get(prompt)
        if found is None:
            offered = ", ".join(sorted(listed)[:20]) or "none"
            raise RoutingRefusal(Code.NOT_FOUND, f"MCP server {name!r} offers no prompt {prompt[:80]!r} "
                                                 f"(its prompts: {offered})")
        takes = {a["name"]: a for a in found["arguments"]}
        unknown = sorted(set(arguments) - set(takes))
        missing = sorted(a for a, spec in takes.items() if spec["required"] and a not in arguments)
        if unknown or missing:
            wanted = ", ".join(f"{a}{'' if spec['required'] else '?'}" for a, spec in takes.items()) or "none"
            what = f"unknown argument {unknown[0]!r}" if unknown else f"missing argument {missing[0]!r}"
            raise RoutingRefusal(Code.INVALID_ARGUMENTS, f"prompt {name}:{prompt}: {what} (it takes: {wanted})")
        return await self._servers[name].connection.get_prompt(prompt, arguments)

    def set_elicitation_handler(self, handler: Any) -> None:
        """Who asks the user when a server sends ``elicitation/create`` during a call (the broker's
        ``ElicitationRouter``; docs/mcp.md, "Elicitation"). None declines every question."""
        for server in self._servers.values():
            server.connection.elicitation_handler = handler

    # -- catalogue -------------------------------------------------------------------------

    def _classified(self, spec: ToolSpec) -> ToolSpec:
        if spec.hints.get(_RELAY_READ_HINT):  # relay's own resources/list and resources/read: reads by protocol
            return spec.model_copy(update={"tool_class": ToolClass.READ, "parallel_safe": True})
        pinned = self.pins.resolve(spec) if self.pins is not None else None
        pins = {spec.name: pinned} if pinned is not None else {}
        tool_class = classify(spec.name, pins=pins, hints=spec.hints)
        # parallel_safe only for tools that end up read: a write never runs alongside another call.
        return spec.model_copy(update={"tool_class": tool_class, "parallel_safe": tool_class == ToolClass.READ})

    def specs(self) -> list[ToolSpec]:
        """Every discovered tool, classified now (pins are looked up on each call)."""
        return [self._classified(tool.spec) for server in self._servers.values() for tool in server.tools.values()]

    def spec(self, name: str) -> ToolSpec | None:
        """The classified spec of ``name``, or None if no connected server offers it."""
        found = self._lookup(name)
        return self._classified(found[1].spec) if found is not None else None

    async def current(self, name: str) -> ToolSpec | None:
        """The classified spec of ``name`` as its server lists it *now*: the server is re-listed
        (``tools/list``; started again if it went away), so a tool changed with or without
        ``notifications/tools/list_changed``, or by a restart, is seen before a call. The executor
        asks this before every MCP call (docs/mcp.md, "Tool identity per call"). None when the
        server no longer offers the tool.

        Raises:
            McpToolError: the server cannot be reached or does not list its tools (``TOOL_ERROR``).
        """
        parts = split_name(name)
        if parts is None or parts[0] not in self._servers:
            return None
        server = self._servers[parts[0]]
        if not await self._connect(server, relist=True):
            raise McpToolError(server.config.name, "connect", server.error or "MCP server unavailable")
        tool = server.tools.get(name)
        return self._classified(tool.spec) if tool is not None else None

    def _lookup(self, name: str) -> tuple[_Server, DiscoveredTool] | None:
        parts = split_name(name)
        if parts is None or parts[0] not in self._servers:
            return None
        server = self._servers[parts[0]]
        tool = server.tools.get(name)
        return (server, tool) if tool is not None else None

    def status(self) -> list[ServerStatus]:
        """One entry per configured server, including disabled and invalid ones."""
        out: list[ServerStatus] = []
        for name, server in self._servers.items():
            cfg = server.config
            conn = server.connection
            if conn.connected:
                state = "connected"
            elif server.error is not None:
                state = "failed"
            else:
                state = "stopped"
            out.append(
                ServerStatus(
                    name=name,
                    transport="stdio" if isinstance(cfg, StdioServerConfig) else "http",
                    source=cfg.shown_source,  # listings never show a token passed on the command line
                    state=state,
                    error=server.error,
                    protocol_version=conn.protocol_version,
                    tools=len(server.tools),
                    problems=list(server.problems),
                )
            )
        for name in self.config.disabled:
            out.append(ServerStatus(name=name, transport="", source="", state="disabled"))
        for name, message in self.config.problems.items():
            if name:
                out.append(ServerStatus(name=name, transport="", source="", state="invalid", error=message))
        return out

    # -- pins ------------------------------------------------------------------------------

    def pin(self, name: str, tool_class: ToolClass | str) -> ToolSpec:
        """Pin a discovered tool at its current digest; returns the re-classified spec."""
        found = self._require_pins_and_tool(name)
        self.pins.pin(found.spec, tool_class)  # type: ignore[union-attr]
        return self._classified(found.spec)

    def unpin(self, name: str) -> bool:
        """Remove the pin of ``server__tool`` (discovered or not; split as the registry routes it)."""
        if self.pins is None:
            raise RoutingRefusal(Code.NOT_FOUND, "no pin store is configured")
        parts = split_name(name)
        return self.pins.unpin(*parts) if parts is not None else False

    def _require_pins_and_tool(self, name: str) -> DiscoveredTool:
        if self.pins is None:
            raise RoutingRefusal(Code.NOT_FOUND, "no pin store is configured")
        found = self._lookup(name)
        if found is None:
            raise RoutingRefusal(Code.UNKNOWN_TOOL, f"no connected MCP server offers a tool named {name!r}")
        return found[1]

    # -- ToolSource (core/tooling.py) ------------------------------------------------------

    def tool_specs(self, ctx: ToolContext) -> list[ToolSpec]:
        """:meth:`specs` (MCP tools are the user's, offered to every caller the grant allows); a server signed
        in to since it failed is connected again in the background."""
        self._retry_signed_in()
        return self.specs()

    async def tool_current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        """:meth:`current`: the server is re-listed before every call (with or without
        ``tools/list_changed``, after a restart too)."""
        return await self.current(name)

    async def tool_preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """Record the digest and annotations of the tool as it is now: the consent is for exactly this
        tool, and :meth:`tool_call` refuses (``DIGEST_MISMATCH``) if the server changed it while the
        card was open."""
        spec = self.spec(name)
        return Preflight(preview={"tool_digest": spec.digest, "tool_hints": dict(spec.hints)}
                         if spec is not None else {})

    async def tool_call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                        approved_preview: dict[str, Any]) -> ToolResult:
        """:meth:`call`, bound to the approved digest and annotations (timeouts and output caps are
        the connection's)."""
        with call_context(ctx):  # a server's question during this call goes to ctx's notebook (elicitation)
            return as_result(await self.call(name, args, expected_digest=approved_preview.get("tool_digest"),
                                             expected_hints=approved_preview.get("tool_hints")))

    # -- calls -----------------------------------------------------------------------------

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        expected_digest: str | None = None,
        expected_hints: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Call ``server__tool``: ``{"content": str, "is_error": bool, "structured": Any, "truncated": bool}``.

        ``expected_digest`` (the digest of the spec the gate approved; defaults to the digest known
        when the call starts) and ``expected_hints`` (its annotations) are re-checked against the
        server's listing — re-listed first when it is older than :data:`RELIST_AFTER` (a card was
        open) or after a reconnect or ``tools/list_changed``: a changed tool is refused with
        ``DIGEST_MISMATCH`` rather than run under a consent given for something else.

        Raises:
            RoutingRefusal: ``UNKNOWN_TOOL`` or ``DIGEST_MISMATCH``.
            McpToolError: the server could not be reached, hung, exited or flooded (``TOOL_ERROR``).
        """
        parts = split_name(name)
        if parts is None or parts[0] not in self._servers:
            raise RoutingRefusal(Code.UNKNOWN_TOOL, f"no MCP server offers a tool named {name!r}")
        server = self._servers[parts[0]]
        known = server.tools.get(name)
        digest = expected_digest or (known.spec.digest if known is not None else None)
        stale = expected_digest is not None and time.monotonic() - server.listed_at > RELIST_AFTER
        needs_connect = not server.connection.connected or server.connection.tools_changed or stale
        if needs_connect and not await self._connect(server, relist=stale):
            raise McpToolError(server.config.name, "connect", server.error or "MCP server unavailable")
        current = server.tools.get(name)
        if current is None:
            raise RoutingRefusal(Code.UNKNOWN_TOOL, f"MCP server {parts[0]!r} no longer offers {name!r}")
        if (digest is not None and current.spec.digest != digest) or (
                expected_hints is not None and current.spec.hints != expected_hints):
            raise RoutingRefusal(
                Code.DIGEST_MISMATCH,
                f"MCP tool {name} changed (description, schema or server) since it was approved; ask again",
            )
        if current.remote_name in _RESOURCE_METHODS:
            return await _call_resource(server.connection, current.remote_name, arguments)
        return await server.connection.call_tool(current.remote_name, arguments, timeout=timeout)


# -- resources as read tools (issue 20 item 4) ------------------------------------------------------------

#: The tools relay adds for a server that announces ``resources``: ``<server>__list_resources`` and
#: ``<server>__read_resource``. Their remote names are the MCP methods (not valid tool names, so a server's own
#: tool can never be routed here); a server that lists a tool of the same name keeps its own (a write).
_RESOURCE_METHODS = {"resources/list": "list_resources", "resources/read": "read_resource"}
_RELAY_READ_HINT = "relay_resource_read"


def _resource_tools(server: str, source: str, connection: McpConnection,
                    listed: list[DiscoveredTool]) -> list[DiscoveredTool]:
    if not connection.offers("resources"):
        return []
    taken = {tool.spec.name for tool in listed}
    schemas = {
        "resources/list": ({"type": "object", "properties": {}, "additionalProperties": False},
                           f"List the resources (files, records, documents) the MCP server '{server}' offers: "
                           "uri, name, description, MIME type. Read-only (MCP resources/list; added by relay)."),
        "resources/read": ({"type": "object", "properties": {"uri": {"type": "string", "maxLength": 2048}},
                            "required": ["uri"], "additionalProperties": False},
                           f"Read one resource of the MCP server '{server}' by its uri (from list_resources). "
                           "Read-only; text only, binary contents are described, output is capped (MCP "
                           "resources/read; added by relay)."),
    }
    out: list[DiscoveredTool] = []
    for method, local in _RESOURCE_METHODS.items():
        name = f"{server}__{local}"
        if name in taken:
            continue
        schema, description = schemas[method]
        spec = ToolSpec(name=name, description=description, input_schema=schema, tool_class=ToolClass.READ,
                        server=server, source=source, parallel_safe=True,
                        hints={"read_only_hint": True, _RELAY_READ_HINT: True})
        out.append(DiscoveredTool(spec=spec, remote_name=method))
    return out


async def _lists_resources(connection: McpConnection) -> bool:
    if not connection.offers("resources"):
        return False
    try:
        return bool(await connection.list_resources())
    except McpToolError as exc:
        if exc.reason != "protocol":
            raise
        return False


async def _call_resource(connection: McpConnection, method: str, arguments: dict[str, Any]) -> dict[str, Any]:
    import json

    from .discovery import truncate_text

    if method == "resources/list":
        listed = await connection.list_resources()
        text, truncated = truncate_text(json.dumps(listed, ensure_ascii=False, indent=1), connection.max_output_bytes)
        return {"content": text, "is_error": False, "structured": None, "truncated": truncated}
    uri = arguments.get("uri")
    if not isinstance(uri, str) or not uri or len(uri) > 2048:
        return {"content": "uri must be a string of 1-2048 characters", "is_error": True, "structured": None,
                "truncated": False}
    try:
        read = await connection.read_resource(uri)
    except McpToolError as exc:
        if exc.reason != "protocol":  # hang, death, flood: as for a tool call
            raise
        return {"content": exc.message, "is_error": True, "structured": None, "truncated": False}
    return {"content": read["content"], "is_error": False, "structured": None, "truncated": read["truncated"]}
