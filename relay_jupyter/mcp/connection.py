"""One live connection to one MCP server (stdio or Streamable HTTP).

A connection is owned by a supervisor task: the MCP SDK's transports hold anyio task groups
that must be entered and left by the same task, so the task that opens the ``mcp.Client`` is
also the one that closes it, while calls are made from any task.

Limits (issue 4, item 4): a connect timeout, a per-call timeout, a per-message byte cap and an
output cap with a truncation marker. A server that hangs, dies or floods gives one clear
:class:`McpToolError` (code ``TOOL_ERROR``); the call is never retried, and the server is
stopped (process group killed) so no process leaks. The next call starts it again.

Protocol versions (:mod:`.versions`): ``2025-03-26``, ``2025-06-18``, ``2025-11-25`` (initialize
handshake) and ``2026-07-28`` (discover); the SDK negotiates, anything else is refused with a message
naming the version, and each connection uses only the features its version has.

Elicitation (:mod:`.elicitation`): a server's ``elicitation/create`` during a call is checked (form
mode, bounded schema, no credential fields) and handed to :attr:`McpConnection.elicitation_handler`
with the call's :data:`~.elicitation.CALL_CONTEXT`; the wait for the person does not count against the
call's timeout. No handler, no single call in flight, a version without elicitation: declined.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp import Client, MCPError
from mcp.client.auth.exceptions import OAuthFlowError
from mcp_types import CONNECTION_CLOSED, Implementation

from ..core.errors import Code, Refusal
from ..core.redact import mask_secret_text
from .config import HttpServerConfig, ServerConfig, StdioServerConfig
from .discovery import DEFAULT_MAX_OUTPUT_BYTES, MAX_LIST_PAGES, render_result, truncate_text
from .elicitation import (
    CALL_CONTEXT,
    MAX_PER_CALL,
    ElicitationAnswer,
    ElicitationAsk,
    ElicitationHandler,
    Refused,
    check_answer,
    parse_form,
    parse_url_request,
)
from .http import HttpTransport
from .stdio import DEFAULT_MAX_MESSAGE_BYTES, StdioTransport
from .versions import MODERN_VERSIONS, SUPPORTED_PROTOCOL_VERSIONS, has, refusal_message

__all__ = ["SUPPORTED_PROTOCOL_VERSIONS", "McpConnection", "McpToolError"]

logger = logging.getLogger(__name__)

# mcp 2.3's ClientSession.initialize: RuntimeError(f"Unsupported protocol version from the server: {v}")
_SDK_VERSION_REFUSAL = "Unsupported protocol version from the server:"
MAX_LISTED = 1000
"""At most this many resources or prompts are taken from one server's listing."""
_CLIENT_INFO = Implementation(name="relay-jupyter", version="0.1.0")
# stderr lines that look like they carry a credential are masked before a user sees them.
_SECRETISH = re.compile(
    r"(?i)(token|secret|passw|api[_-]?key|authorization|bearer|sk-[a-z0-9]|ghp_|AKIA[0-9A-Z]{8})"
)


class McpToolError(Refusal):
    """An MCP server could not be reached or failed a call (hang, exit, flood, protocol).

    ``data`` = ``{"server": name, "reason": "connect" | "timeout" | "exited" | "flood" | "protocol"
    | "version" | "closed" | "auth"}`` (``auth``: an HTTP server answered 401/403). Never carries a header, env value or stderr secret.
    """

    def __init__(self, server: str, reason: str, message: str) -> None:
        super().__init__(Code.TOOL_ERROR, message, data={"server": server, "reason": reason})
        self.server = server
        self.reason = reason


def _unwrap(exc: BaseException) -> BaseException:
    """The single leaf of nested one-member exception groups (anyio wraps task-group failures)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _consume(future: asyncio.Future[None]) -> None:
    """Mark a failure nobody waits for any more as retrieved.

    Otherwise asyncio logs "exception was never retrieved" at GC, formatting a deep anyio
    exception group; on CPython 3.11 a RecursionError swallowed there corrupts the AST
    recursion counter and a later ``ast.parse`` fails with SystemError.
    """
    if future.done() and not future.cancelled():
        future.exception()


def _sdk_refused_version(exc: BaseException) -> str | None:
    """The version the SDK refused in the handshake, if ``exc`` is that refusal."""
    if isinstance(exc, RuntimeError) and str(exc).startswith(_SDK_VERSION_REFUSAL):
        return str(exc)[len(_SDK_VERSION_REFUSAL):].strip()[:40]
    return None


def _stderr_hint(transport: Any) -> str:
    if not isinstance(transport, StdioTransport):
        return ""
    lines = [line.strip()[:200] for line in transport.stderr_tail().splitlines() if line.strip()][-4:]
    lines = ["<line masked: looks like a secret>" if _SECRETISH.search(line) else line for line in lines]
    return (" Its stderr ended with: " + " | ".join(lines)) if lines else ""


@dataclass
class _InFlight:
    """One ``tools/call`` waiting for its answer (elicitations are attributed to it)."""

    tool: str
    context: Any
    timer: asyncio.Timeout | None = None
    elicited: int = 0


class McpConnection:
    """A supervised ``mcp.Client`` for one configured server."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        call_timeout: float = 60.0,
        connect_timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        shutdown_grace: float = 2.0,
    ) -> None:
        self.config = config
        self.name = config.name
        self.call_timeout = config.timeout or call_timeout
        self.connect_timeout = connect_timeout
        self.max_message_bytes = max_message_bytes
        self.max_output_bytes = max_output_bytes
        self.shutdown_grace = shutdown_grace
        self.protocol_version: str | None = None
        self.tools_changed = False
        """Set when the server sends ``notifications/tools/list_changed``; the registry re-lists."""
        self.elicitation_handler: ElicitationHandler | None = None
        """Who asks the user when the server sends ``elicitation/create`` (the broker's router); None declines."""
        self.sign_in_hint: str | None = None
        """How the user signs in, ending a "needs sign-in" message (set with :attr:`http_auth` by the registry)."""
        self.elicitation_log: list[dict[str, Any]] = []
        """The last elicitations relay declined without asking (kind, reason), newest last, at most 20."""
        self.http_auth: Any = None
        """For a Streamable HTTP server: a callable ``(config) -> httpx2.Auth`` (the OAuth provider of
        ``mcp/oauth.py``), made anew for each connection; None sends only the configured headers."""
        self._inflight: dict[int, _InFlight] = {}
        self._ids = itertools.count(1)
        self._transport: StdioTransport | HttpTransport | None = None
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._client is not None and self._task is not None and not self._task.done()

    @property
    def pid(self) -> int | None:
        """The stdio server's pid (None for HTTP or before start)."""
        return self._transport.pid if isinstance(self._transport, StdioTransport) else None

    def _make_transport(self) -> StdioTransport | HttpTransport:
        if isinstance(self.config, StdioServerConfig):
            return StdioTransport(
                self.config, max_message_bytes=self.max_message_bytes, shutdown_grace=self.shutdown_grace
            )
        assert isinstance(self.config, HttpServerConfig)
        return HttpTransport(
            self.config, max_message_bytes=self.max_message_bytes, connect_timeout=self.connect_timeout,
            auth=self.http_auth(self.config) if self.http_auth is not None else None,
        )

    async def open(self) -> None:
        """Start (stdio) or reach (HTTP) the server and negotiate. Raises :class:`McpToolError` (``connect``)."""
        if self.connected:
            return
        self._transport = self._make_transport()
        self._closing = asyncio.Event()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ready.add_done_callback(_consume)
        self._task = asyncio.create_task(self._supervise(self._transport, self._closing, ready),
                                         name=f"mcp:{self.name}")
        try:
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            await self.close(force=True)
            raise McpToolError(
                self.name, "connect",
                f"MCP server {self.name!r} did not complete the MCP handshake within {self.connect_timeout:g} s"
                + _stderr_hint(self._transport),
            ) from None
        except McpToolError:
            await self.close(force=True)
            raise
        except BaseException as exc:
            await self.close(force=True)
            if isinstance(exc, asyncio.CancelledError):
                raise
            inner = _unwrap(exc)
            if isinstance(inner, McpToolError):
                raise inner from None
            if type(inner).__name__ == "SignInNeeded":  # mcp/signin.py: OAuth needs a person, none asked yet
                raise McpToolError(self.name, "auth", self._sign_in_message()) from None
            if isinstance(inner, OAuthFlowError) and getattr(self.config, "client_id", None):
                # a machine client (client_credentials): the authorization server refused, or is not the issuer
                # configured; its text is the SDK's (the server's error code), cut, never a secret of ours
                said = mask_secret_text(" ".join(str(inner).split()))[:300]
                raise McpToolError(self.name, "auth", f"MCP server {self.name!r} at {self.config.shown_source}: the "
                                   f"OAuth client_credentials grant failed: {said}") from None
            reason = "version" if _sdk_refused_version(inner) is not None else (
                "auth" if self._auth_status() is not None else "connect")
            raise McpToolError(self.name, reason, self._connect_message(inner)) from None

    def _connect_message(self, inner: BaseException) -> str:
        version = _sdk_refused_version(inner)
        if version is not None:
            # the SDK refused the handshake answer (a version it has never heard of, or a modern
            # version offered through initialize): say so, not "exited" or "unreachable"
            if version in SUPPORTED_PROTOCOL_VERSIONS:
                return (f"MCP server {self.name!r} answered the initialize handshake with protocol {version}, "
                        "which that handshake cannot negotiate; refused")
            return refusal_message(self.name, version)
        if isinstance(inner, FileNotFoundError) and isinstance(self.config, StdioServerConfig):
            return f"MCP server {self.name!r}: command not found: {self.config.command}"
        if isinstance(inner, PermissionError) and isinstance(self.config, StdioServerConfig):
            return f"MCP server {self.name!r}: permission denied running {self.config.command}"
        if isinstance(self.config, HttpServerConfig):
            auth = self._auth_message()
            if auth is not None:
                return auth
            what = type(inner).__name__
            return f"MCP server {self.name!r} at {self.config.url} could not be reached ({what})"
        if self._flooded():
            return (f"MCP server {self.name!r} sent a message larger than {self.max_message_bytes} bytes "
                    "during the handshake; it was stopped")
        code = self._transport.returncode if isinstance(self._transport, StdioTransport) else None
        exited = f"exited with code {code}" if code is not None else f"failed ({type(inner).__name__})"
        return (
            f"MCP server {self.name!r} {exited} during the MCP handshake" + _stderr_hint(self._transport)
        )

    async def _supervise(
        self, transport: StdioTransport | HttpTransport, closing: asyncio.Event, ready: asyncio.Future[None]
    ) -> None:
        try:
            async with Client(
                transport,
                mode="auto",
                client_info=_CLIENT_INFO,
                message_handler=self._on_message,
                elicitation_callback=self._on_elicit,
                cache=None,
            ) as client:
                version = client.protocol_version
                if version not in SUPPORTED_PROTOCOL_VERSIONS:
                    raise McpToolError(self.name, "version", refusal_message(self.name, version))
                self.protocol_version = version
                self._client = client
                if not ready.done():
                    ready.set_result(None)
                # 2026-07-28 delivers tools/list_changed only to a subscriptions/listen stream
                listener = (asyncio.create_task(self._listen(client), name=f"mcp-listen:{self.name}")
                            if version in MODERN_VERSIONS else None)
                try:
                    await closing.wait()
                finally:
                    if listener is not None:
                        listener.cancel()
                        await asyncio.gather(listener, return_exceptions=True)
        except BaseException as exc:  # the opener gets it; a late failure only ends the connection
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            elif not isinstance(exc, (asyncio.CancelledError, Exception)):
                raise
            else:
                logger.debug("MCP connection %r ended: %s", self.name, type(exc).__name__)
        finally:
            self._client = None

    async def _listen(self, client: Client) -> None:
        """Mark the tool list stale on every ``tools/list_changed`` event of a 2026-07-28 server.
        Best effort: the registry re-lists before every call anyway (``McpRegistry.current``), so
        a server without ``subscriptions/listen`` loses nothing but an early refresh."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self.tools_changed = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - see the docstring
            logger.debug("MCP server %r: no tools/list_changed subscription (%s)", self.name, type(exc).__name__)

    async def _on_message(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self.tools_changed = True
        await anyio.lowlevel.checkpoint()

    async def close(self, *, force: bool = False) -> None:
        """Close the session and stop the server; with ``force`` the process group is killed first."""
        task, transport = self._task, self._transport
        if task is None:
            return
        if force and isinstance(transport, StdioTransport):
            transport.kill()
        if self._closing is not None:
            self._closing.set()
        try:
            # Bounded: the transport's own shutdown is bounded (grace + kill); this is a backstop.
            async with asyncio.timeout(self.shutdown_grace + 10.0):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            logger.warning("MCP connection %r did not close in time; cancelled", self.name)
        except BaseException as exc:  # noqa: BLE001 - failures were reported through `ready` already
            logger.debug("MCP connection %r closed after %s", self.name, type(exc).__name__)
        self._client = None
        self._task = None

    # -- requests --------------------------------------------------------------------------

    def _require(self) -> Client:
        if self._client is None:
            raise McpToolError(self.name, "closed", f"MCP server {self.name!r} is not connected")
        return self._client

    async def list_tools(self) -> list[types.Tool]:
        """Every listed tool, following pagination up to ``MAX_LIST_PAGES`` pages, within the call timeout."""
        client = self._require()
        tools: list[types.Tool] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(self.call_timeout):
                for _ in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except TimeoutError:
            await self.close(force=True)
            raise McpToolError(
                self.name, "timeout", f"MCP server {self.name!r} did not list its tools within {self.call_timeout:g} s"
            ) from None
        except MCPError as exc:
            raise await self._failure(exc, "tools/list") from None
        self.tools_changed = False
        return tools

    async def call_tool(self, remote_name: str, arguments: dict[str, Any], *, timeout: float | None = None
                        ) -> dict[str, Any]:
        """Call one tool: ``{"content", "is_error", "structured", "truncated"}``. Never retried.

        Raises :class:`McpToolError` when the server hangs past the timeout, exits, floods or
        breaks the protocol; the server is then stopped (it restarts on the next call).
        """
        client = self._require()
        limit = timeout or self.call_timeout
        key = next(self._ids)
        inflight = _InFlight(tool=f"{self.name}__{remote_name}", context=CALL_CONTEXT.get())
        self._inflight[key] = inflight
        try:
            async with asyncio.timeout(limit) as timer:
                inflight.timer = timer
                result = await client.call_tool(remote_name, arguments)
        except TimeoutError:
            flooded = self._flooded()
            await self.close(force=True)
            if flooded:
                raise self._flood_error() from None
            raise McpToolError(
                self.name, "timeout",
                f"MCP tool {self.name}__{remote_name} did not answer within {limit:g} s; the call was abandoned "
                f"and {'the server stopped' if isinstance(self.config, StdioServerConfig) else 'the connection closed'}"
                " (the action may still have happened). It is not retried.",
            ) from None
        except MCPError as exc:
            raise await self._failure(exc, remote_name) from None
        except (ValueError, TypeError) as exc:  # pydantic: a result that breaks the negotiated protocol
            raise McpToolError(
                self.name, "protocol", f"MCP server {self.name!r} sent a malformed result ({type(exc).__name__})"
            ) from None
        finally:
            self._inflight.pop(key, None)
        if self._flooded():
            await self.close(force=True)
            raise self._flood_error()
        if not has(self.protocol_version, "structured_content") and result.structured_content is not None:
            # a 2025-03-26 server has no structured results: what its version cannot say is not passed on
            result = result.model_copy(update={"structured_content": None})
        return render_result(result, self.max_output_bytes)

    # -- resources and prompts (reads; not yet offered to runs: docs/mcp.md) ---------------------

    def offers(self, capability: str) -> bool:
        """Whether the server announced ``resources`` / ``prompts`` / ``tools`` in its capabilities."""
        client = self._require()
        caps = client.server_capabilities
        return getattr(caps, capability, None) is not None

    async def _bounded(self, what: str, fetch: Any) -> Any:
        client = self._require()
        try:
            async with asyncio.timeout(self.call_timeout):
                return await fetch(client)
        except TimeoutError:
            await self.close(force=True)
            raise McpToolError(self.name, "timeout",
                               f"MCP server {self.name!r} did not answer {what} within {self.call_timeout:g} s") from None
        except MCPError as exc:
            raise await self._failure(exc, what) from None
        except (ValueError, TypeError) as exc:
            raise McpToolError(self.name, "protocol",
                               f"MCP server {self.name!r} sent a malformed {what} answer ({type(exc).__name__})") from None

    async def list_resources(self) -> list[dict[str, Any]]:
        """``[{uri, name, description, mime_type}]``: at most ``MAX_LIST_PAGES`` pages and
        :data:`MAX_LISTED` entries; every string cut (a server's listing is untrusted)."""
        if not self.offers("resources"):
            return []

        async def fetch(client: Client) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_resources(cursor=cursor, cache_mode="bypass")
                out += [{"uri": r.uri[:2048], "name": (r.name or "")[:200],
                         "description": (r.description or "")[:500], "mime_type": (r.mime_type or "")[:100]}
                        for r in page.resources]
                cursor = page.next_cursor
                if not cursor or len(out) >= MAX_LISTED:
                    break
            return out[:MAX_LISTED]

        return await self._bounded("resources/list", fetch)

    async def read_resource(self, uri: str) -> dict[str, Any]:
        """``{"content": str, "truncated": bool}``: text contents joined, binary ones as placeholders
        (never base64 to the model), capped at ``max_output_bytes`` with the truncation marker."""

        async def fetch(client: Client) -> Any:
            return await client.read_resource(uri, cache_mode="bypass")

        result = await self._bounded("resources/read", fetch)
        parts = []
        for item in result.contents:
            if isinstance(item, types.TextResourceContents):
                parts.append(item.text)
            else:
                parts.append(f"[binary resource {item.uri}: {item.mime_type or 'unknown type'}, not shown]")
        content, truncated = truncate_text("\n".join(parts), self.max_output_bytes)
        return {"content": content, "truncated": truncated}

    async def list_prompts(self) -> list[dict[str, Any]]:
        """``[{name, description, arguments: [{name, description, required}]}]``, bounded like resources."""
        if not self.offers("prompts"):
            return []

        async def fetch(client: Client) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_prompts(cursor=cursor, cache_mode="bypass")
                out += [{"name": p.name[:200], "description": (p.description or "")[:500],
                         "arguments": [{"name": a.name[:100], "description": (a.description or "")[:300],
                                        "required": bool(a.required)} for a in (p.arguments or [])[:32]]}
                        for p in page.prompts]
                cursor = page.next_cursor
                if not cursor or len(out) >= MAX_LISTED:
                    break
            return out[:MAX_LISTED]

        return await self._bounded("prompts/list", fetch)

    async def get_prompt(self, name: str, arguments: dict[str, str] | None = None) -> dict[str, Any]:
        """``{"messages": [{"role", "text"}], "truncated": bool}``: text blocks as text, other content as
        placeholders, the whole capped at ``max_output_bytes``."""

        async def fetch(client: Client) -> Any:
            return await client.get_prompt(name, arguments or {})

        result = await self._bounded("prompts/get", fetch)
        budget, truncated, messages = self.max_output_bytes, False, []
        for message in result.messages:
            block = message.content
            text = block.text if isinstance(block, types.TextContent) else f"[{getattr(block, 'type', '?')} content, not shown]"
            cut, was_cut = truncate_text(text, max(0, budget))
            budget -= len(cut.encode())
            truncated = truncated or was_cut
            messages.append({"role": message.role, "text": cut})
            if budget <= 0:
                truncated = True
                break
        return {"messages": messages, "truncated": truncated}

    # -- elicitation -----------------------------------------------------------------------

    def _declined(self, kind: str, reason: str) -> types.ElicitResult:
        self.elicitation_log = [*self.elicitation_log[-19:], {"kind": kind, "reason": reason, "at": time.time()}]
        logger.info("MCP server %r: elicitation declined without asking (%s)", self.name, kind)
        return types.ElicitResult(action="decline")

    async def _on_elicit(self, context: Any, params: Any) -> types.ElicitResult | types.ErrorData:
        """``elicitation/create`` from the server: check it, attribute it to the one call in flight,
        ask through :attr:`elicitation_handler`, check the answer. Every path ends in an answer."""
        if not has(self.protocol_version, "elicitation_form"):
            return types.ErrorData(code=types.METHOD_NOT_FOUND,
                                   message=f"elicitation is not part of protocol {self.protocol_version}")
        url_mode = isinstance(params, types.ElicitRequestURLParams) or getattr(params, "mode", "form") == "url"
        if url_mode and not has(self.protocol_version, "elicitation_url"):
            return types.ErrorData(code=types.INVALID_PARAMS,
                                   message=f"URL elicitation is not part of protocol {self.protocol_version}")
        if not url_mode and getattr(params, "mode", "form") not in ("form", None):
            return types.ErrorData(code=types.INVALID_PARAMS, message="unknown elicitation mode")
        if self.elicitation_handler is None:
            return self._declined("context", "nobody to ask (no broker is attached)")
        # The call this request belongs to: the task's own (2026-07-28 input requests run in the
        # calling task), else the connection's only call in flight. With two calls in flight over one
        # connection the request cannot be attributed to a notebook: it is declined, never guessed.
        own = CALL_CONTEXT.get()
        calls = [c for c in self._inflight.values() if own is None or c.context is own]
        if len(calls) != 1 or calls[0].context is None:
            return self._declined("context", "the request could not be tied to one tool call of a notebook")
        call = calls[0]
        if call.elicited >= MAX_PER_CALL:
            return self._declined("limit", f"more than {MAX_PER_CALL} requests during one tool call")
        call.elicited += 1
        url: str | None = None
        try:
            if url_mode:
                message, url, _host = parse_url_request(params.message, getattr(params, "url", None))
                fields: tuple[Any, ...] = ()
            else:
                message, fields = parse_form(params.message, params.requested_schema)
        except Refused as exc:
            # The handler is told (the notebook shows one line and the audit records it); whatever it
            # answers, a refused request is declined.
            refused = ElicitationAsk(server=self.name, message=str(params.message)[:200], fields=(),
                                     context=call.context, tool=call.tool, protocol_version=self.protocol_version,
                                     refused=exc.reason, refused_kind=exc.kind)
            try:
                await self.elicitation_handler(refused)
            except Exception as err:  # noqa: BLE001 - the notice is best effort; the decline is not
                logger.debug("MCP server %r: refusal notice failed (%s)", self.name, type(err).__name__)
            return self._declined(exc.kind, exc.reason)
        ask = ElicitationAsk(server=self.name, message=message, fields=fields, context=call.context,
                             tool=call.tool, protocol_version=self.protocol_version, url=url,
                             elicitation_id=str(getattr(params, "elicitation_id", "") or "")[:200] or None)
        # The person's time is not the server's: the call's deadline is paused while the card is open.
        loop = asyncio.get_running_loop()
        timer = call.timer
        left = (timer.when() - loop.time()) if timer is not None and timer.when() is not None else None
        if timer is not None:
            timer.reschedule(None)
        try:
            answer = await self.elicitation_handler(ask)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken router declines; it never accepts
            logger.warning("MCP server %r: elicitation handler failed (%s); declined", self.name, type(exc).__name__)
            answer = ElicitationAnswer("decline", answered_by="relay", reason="internal error")
        finally:
            if timer is not None and left is not None:
                timer.reschedule(loop.time() + max(left, 1.0))
        if answer.action != "accept":
            return types.ElicitResult(action="cancel" if answer.action == "cancel" else "decline")
        if url_mode:  # the person opened the page: nothing of theirs passes through relay
            return types.ElicitResult(action="accept")
        try:
            content = check_answer(fields, answer.content or {})
        except ValueError:
            return self._declined("schema", "the answer did not fit the form")  # the router checks first
        return types.ElicitResult(action="accept", content=content)

    def _auth_status(self) -> int | None:
        return self._transport.auth_status if isinstance(self._transport, HttpTransport) else None

    def _auth_message(self) -> str | None:
        """"Needs authorisation" with a one-line hint, when the server answered 401/403 (never a header value)."""
        status = self._auth_status()
        if status is None:
            return None
        assert isinstance(self.config, HttpServerConfig)
        shown = self.config.shown_source
        if status == 403:
            return (f"MCP server {self.name!r} at {shown} refused access (HTTP 403): the credentials in mcp.json "
                    "are not allowed to use it; check the token's scopes")
        configured = any(k.lower() == "authorization" for k in self.config.headers)
        hint = ("the token in its mcp.json \"headers\" was refused: replace it"
                if configured else "add a token to its mcp.json entry: \"headers\": {\"Authorization\": \"Bearer …\"}")
        if self._transport.auth_offers_oauth and self.http_auth is not None:
            return self._sign_in_message()
        oauth = "; it offers OAuth sign-in, which relay does not do yet" if self._transport.auth_offers_oauth else ""
        return f"MCP server {self.name!r} at {shown} needs authorisation (HTTP 401): {hint}{oauth}"

    def _sign_in_message(self) -> str:
        shown = getattr(self.config, "shown_source", self.name)
        how = self.sign_in_hint or f"sign in from a notebook with relay.sign_in({self.name!r})"
        return f"MCP server {self.name!r} at {shown} needs sign-in (HTTP 401, OAuth): {how}"

    def _flooded(self) -> bool:
        return bool(self._transport is not None and self._transport.flooded)

    def _flood_error(self) -> McpToolError:
        ended = "the server was stopped" if isinstance(self.config, StdioServerConfig) else "the connection was closed"
        return McpToolError(
            self.name, "flood",
            f"MCP server {self.name!r} sent a message larger than {self.max_message_bytes} bytes; "
            f"the call failed and {ended}",
        )

    async def _failure(self, exc: MCPError, what: str) -> McpToolError:
        if self._flooded():
            await self.close(force=True)
            return self._flood_error()
        auth = self._auth_message() if isinstance(self.config, HttpServerConfig) else None
        if auth is not None:  # the token expired or was revoked mid-session
            await self.close(force=True)
            return McpToolError(self.name, "auth", auth)
        if exc.code != CONNECTION_CLOSED:
            # A JSON-RPC error from the server: a tool-level failure, the connection stays up.
            return McpToolError(self.name, "protocol", f"MCP server {self.name!r} refused {what}: {exc.message[:300]}")
        transport = self._transport
        await self.close(force=True)
        code = transport.returncode if isinstance(transport, StdioTransport) else None
        exited = f" (exit code {code})" if code is not None else ""
        return McpToolError(
            self.name, "exited",
            f"MCP server {self.name!r} closed the connection during {what}{exited}; the call failed and is "
            "not retried" + _stderr_hint(transport),
        )
