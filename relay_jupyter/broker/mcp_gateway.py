"""The gated MCP gateway: relay as one Streamable HTTP MCP server for another MCP client (docs/mcp.md).

Another agent — the ``claude`` CLI of the claude-code engine, Claude Code on the desktop, Cursor — gets
the user's tools only through relay's gate: :meth:`McpGateway.handle` answers ``tools/list`` with one
origin's granted tools and runs every ``tools/call`` through the one executor (``tools.call``'s path:
size bound, the tool re-read from its source, JSON Schema, preflight, grant → allowlist → budget → class
→ consent for writes, the MCP digest binding, audit; call ids ``mcpgw_…``).

Who may call: the holder of a **gateway token** minted by :meth:`McpGateway.session` for one origin
(and optionally one run and the client id that answers its cards), sent as ``Authorization: Bearer``.
Nothing else: no cookie, no Jupyter token, no token in the URL (refused, and the URL is never logged).
Tokens are kept as SHA-256 digests, compared in constant time, never logged, evented or audited.

The wire: JSON-RPC over ``POST`` answered with ``application/json`` (the Streamable HTTP transport
allows a JSON answer instead of an SSE stream), stateless (no ``Mcp-Session-Id``), handshake-era
protocol versions (``initialize``: 2025-03-26, 2025-06-18, 2025-11-25; a 2026-07-28 client's
``server/discover`` gets "method not found", which the MCP SDKs answer by falling back to
``initialize``). Hand-written on tornado (as ``engine_endpoint.py``) rather than the SDK's ASGI server:
the Jupyter server is tornado, the daemon too, and the surface is five methods.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tornado.web import RequestHandler

from ..core.tooling import ToolContext, ToolResult
from ..core.types import PermissionMode, ToolClass
from ..runtime.executor import refusal_of
from ..runtime.tools import ToolIndex
from .conversation_keys import conversation_key
from .gateway_links import ProposedCalls
from .run_keys import MAX_KEY_CHARS, KeyRing, listen_loopback
from .tool_sources import tool_sources

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["GATEWAY_PROTOCOL_VERSIONS", "MAX_BODY_BYTES", "TOKENS_FILE", "GatewayHandler", "GatewaySession",
           "McpGateway", "mcp_gateway_of", "mint_token", "read_tokens", "revoke_tokens", "tokens_file"]

log = logging.getLogger(__name__)

#: What ``initialize`` negotiates (oldest first); a client asking another version gets the newest.
GATEWAY_PROTOCOL_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
MAX_BODY_BYTES = 1 << 20
_CALLER_KIND = "mcp-gateway"  # not "kernel": kernel tools only for an engine run's session (caller_kind) or
# through the notebook's one live kernel (ToolContext.kernel: _notebook_kernel)
_TOKEN_PREFIX = "relay-mcp-"
_UNAUTHORIZED = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"a relay MCP gateway token is required (Authorization: Bearer)"}}'


@dataclass
class GatewaySession:
    """One client's access: put ``url`` and ``Authorization: Bearer <token>`` into the client's MCP config."""

    url: str
    token: str = field(repr=False)
    origin: str
    originator: str | None = None
    """Client id that answers this session's consent cards (a run's kernel); None: the side panel."""
    run_id: str | None = None
    conversation: str = ""
    mode: PermissionMode = PermissionMode.ASK
    label: str = "client"
    calls: int = 0
    caller_kind: str | None = None
    """An engine run's session: the kind of the caller that started the run (``kernel``, ``daemon``). The calls
    then have that run's tool context, so the run's own kernel's tools are offered exactly as the relay engine
    offers them (``core/tooling.offers_kernel_tools``). None (outside clients): kernel tools only through the
    notebook's one live kernel (:meth:`McpGateway._notebook_kernel`)."""
    allowed: frozenset[str] | None = None
    """An engine run's ``--tools`` (``RunParams.tools``): only these of the granted tools are offered and callable,
    as the relay engine's ``ToolIndex(allowed=)``; None: every granted tool."""
    proposed: ProposedCalls = field(default_factory=ProposedCalls, repr=False)
    """The model's ``tool_use`` ids the engine announced (``broker/gateway_links.py``): a call is journalled
    and audited under its id."""

    def client_config(self) -> dict[str, Any]:
        """The entry an MCP client's config takes for this session (claude-agent-sdk ``mcp_servers={"relay": ...}``,
        Claude Code's ``.mcp.json``): ``{"type": "http", "url": ..., "headers": {"Authorization": "Bearer ..."}}``.
        It holds the token: pass it to the client's process only, never log it."""
        return {"type": "http", "url": self.url, "headers": {"Authorization": f"Bearer {self.token}"}}

    def __repr__(self) -> str:  # the token never appears in a repr, a log line or a traceback
        return f"GatewaySession(url={self.url!r}, origin={self.origin!r}, run_id={self.run_id!r}, label={self.label!r})"


class McpGateway:
    """The broker's gateway: tokens per origin, the JSON-RPC handling, and a loopback listener for
    subprocesses the broker starts (engines), which need no Jupyter URL, token or cookie."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._sessions: KeyRing[GatewaySession] = KeyRing()  # broker/run_keys.py, as the engine endpoint's keys
        self._server: Any = None
        self._port: int | None = None
        self._standalone: Any = None

    # -- tokens --------------------------------------------------------------------------------

    def _start(self) -> int:
        if self._port is None:
            from tornado.web import Application

            app = Application([(r"/mcp", GatewayHandler, {"gateway": self, "file_tokens": False})],
                              log_function=_log_request)
            self._server, self._port = listen_loopback(app, MAX_BODY_BYTES)
        return self._port

    async def session(self, origin: str, *, originator: str | None = None, run_id: str | None = None,
                      conversation: str = "", mode: PermissionMode | str = PermissionMode.ASK,
                      label: str = "client", url: str | None = None,
                      caller_kind: str | None = None, allowed: Any = None) -> GatewaySession:
        """Mint a token for ``origin``; the session's ``url`` is the loopback listener (started on first use)
        unless ``url`` names another mount of the gateway (``{base_url}relay/mcp`` in the Jupyter server).
        Revoke it with :meth:`end`."""
        if not isinstance(origin, str) or not origin:
            raise ValueError("a gateway session needs an origin")
        if url is None:
            url = f"http://127.0.0.1:{self._start()}/mcp"
        token = KeyRing.new_key(_TOKEN_PREFIX)
        session = GatewaySession(url=url, token=token, origin=origin, originator=originator, run_id=run_id,
                                 conversation=conversation, mode=PermissionMode(mode), label=label[:64],
                                 caller_kind=caller_kind, allowed=None if allowed is None else frozenset(allowed))
        self._sessions.add(token, session)
        return session

    def end(self, session: GatewaySession) -> bool:
        """Revoke ``session``'s token; True if it was live."""
        return self._sessions.pop(session.token) is not None

    def end_origin(self, origin: str) -> int:
        """Revoke every token of ``origin`` (its kernel ended, its grant was revoked)."""
        return self._sessions.drop(lambda s: s.origin == origin)

    def authenticate(self, presented: str, *, file_tokens: bool = True) -> GatewaySession | None:
        """The session of a presented token. ``file_tokens=False`` (the loopback listener, for subprocesses
        the broker starts) takes only the broker's in-process sessions, never a ``jupyter relay mcp-token``."""
        session = self._sessions.find(presented)
        if session is None:
            if not presented or len(presented) > MAX_KEY_CHARS:
                return None
            digest = KeyRing.digest(presented)
            return self._file_session(digest) if file_tokens else None
        return session

    def _tokens_path(self) -> Path:
        from ..storage.paths import data_dir

        config_dir = getattr(self.broker.config, "data_dir", None)
        return tokens_file(Path(config_dir) if config_dir else data_dir(create=False))

    def _file_session(self, digest: bytes) -> GatewaySession | None:
        """A token minted by ``jupyter relay mcp-token`` (another process): its digest in the 0600 token file."""
        entry = read_tokens(self._tokens_path()).get(digest.hex())
        if not isinstance(entry, dict) or not isinstance(entry.get("origin"), str):
            return None
        expires = entry.get("expires_at")
        if isinstance(expires, int | float) and expires < time.time():
            return None
        origin = entry["origin"]
        # an outside client has no kernel to show a card in: consent goes to the side panel (a browser
        # session); a daemon client's origin ``daemon:NAME`` is also its client id (server/daemon_auth.py
        # daemon_caller), so that client answers the cards over the daemon's RPC (no browser there)
        originator = origin if origin.startswith("daemon:") else None
        return GatewaySession(url="", token="", origin=origin, originator=originator,
                              label=str(entry.get("label", "client"))[:64])

    async def aclose(self) -> None:
        self._sessions.clear()
        if self._server is not None:
            self._server.stop()
            self._server, self._port = None, None

    # -- MCP -----------------------------------------------------------------------------------

    def _context(self, session: GatewaySession) -> ToolContext:
        conversation = conversation_key(session.origin, session.conversation) if session.conversation else ""
        return ToolContext(origin=session.origin, conversation=conversation, originator=session.originator,
                           run_id=session.run_id, mode=session.mode,
                           caller_kind=session.caller_kind or _CALLER_KIND, kernel=self._notebook_kernel(session))

    def _notebook_kernel(self, session: GatewaySession) -> str | None:
        """For an outside client's notebook token (no run, no engine): the client id of that notebook's kernel
        when exactly one kernel's event stream is live for the origin (``%load_ext relay_jupyter`` opened it),
        so kernel tools can run there (broker/kernel_bridge.py, live-only requests). None otherwise: with no
        kernel, or two, kernel tools are not offered (two kernels could not be told apart by the request)."""
        if session.caller_kind is not None or session.run_id is not None or session.originator is not None:
            return None
        if not session.origin.startswith("notebook:"):
            return None
        kernels = self.broker.events.kernel_clients(session.origin)
        return next(iter(kernels)) if len(kernels) == 1 else None

    def tools(self, session: GatewaySession) -> list[dict[str, Any]]:
        """The origin's tools its grant allows, as MCP ``Tool`` objects (kernel tools only for an engine run
        started by a kernel: that kernel's; or, for an outside client's notebook token, while that notebook's
        one kernel is attached)."""
        grant = self.broker.grants.get(session.origin)
        if grant is None:
            return []
        out: list[dict[str, Any]] = []
        for spec in ToolIndex(tool_sources(self.broker), self._context(session), allowed=session.allowed).specs():
            if not grant.allows_tool(spec.name):
                continue
            tool: dict[str, Any] = {"name": spec.name, "description": spec.description,
                                    "inputSchema": spec.input_schema}
            read = spec.tool_class in (ToolClass.READ, ToolClass.CONTAINED)
            tool["annotations"] = {"readOnlyHint": read, "destructiveHint": not read}
            out.append(tool)
        return out

    async def call(self, session: GatewaySession, name: Any, arguments: Any, meta: Any = None) -> dict[str, Any]:
        """One ``tools/call`` through the one executor; a refusal is an ``isError`` result naming its code."""
        if not isinstance(name, str) or not name or len(name) > 200:
            return _text_result("refused (UNKNOWN_TOOL): the tool name must be a string", True)
        if arguments is None:
            arguments = {}
        session.calls += 1
        ctx = self._context(session)
        linked = session.proposed.claim(name, arguments, meta) if session.run_id else None  # the model's id
        result = await self._execute(ctx, name, arguments, linked, session.allowed)
        refusal = refusal_of(result)
        if refusal is not None:
            return _text_result(f"refused ({refusal.code.value}): {refusal.message}", True)
        return _text_result(result.content, bool(result.is_error))

    async def _execute(self, ctx: ToolContext, name: str, arguments: Any,
                       call_id: str | None = None, allowed: frozenset[str] | None = None) -> ToolResult:
        call_id = call_id or "mcpgw_" + secrets.token_hex(8)
        runs = self.broker.runs
        if runs is not None:
            runs.check_storage()  # a call the broker could not audit is refused before it starts
            return await runs.executor.execute_client_call(ctx, ToolIndex(runs.providers, ctx, allowed=allowed), name,
                                                           arguments, call_id)
        from .methods.tools import _executor  # a broker with no runtime: the same standalone executor

        return await _executor(self.broker).execute_client_call(
            ctx, ToolIndex(tool_sources(self.broker), ctx, allowed=allowed), name, arguments, call_id)

    async def handle(self, session: GatewaySession, body: bytes) -> tuple[int, bytes | None]:
        """One POST body -> ``(status, JSON answer or None for 202)``."""
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            return 400, _error(None, -32700, "parse error")
        if isinstance(message, list):
            return 400, _error(None, -32600, "batches are not supported")
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return 400, _error(None, -32600, "invalid request")
        if "method" not in message:  # a response or an error from the client: nothing asked it
            return 202, None
        method, msg_id = message.get("method"), message.get("id")
        if "id" not in message:  # a notification (initialized, cancelled, ...)
            return 202, None
        if not (msg_id is None or isinstance(msg_id, str | int)) or isinstance(msg_id, bool):
            return 400, _error(None, -32600, "invalid id")
        params = message.get("params") or {}
        if not isinstance(params, dict):
            return 200, _error(msg_id, -32602, "params must be an object")
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in GATEWAY_PROTOCOL_VERSIONS else GATEWAY_PROTOCOL_VERSIONS[-1]
            return 200, _result(msg_id, {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "relay", "version": _version()},
                "instructions": "relay-jupyter's gate: every call is checked against your grant, budget and "
                                "class; writes wait for the user's approval in the notebook."})
        if method == "ping":
            return 200, _result(msg_id, {})
        if method == "tools/list":
            return 200, _result(msg_id, {"tools": self.tools(session)})
        if method == "tools/call":
            return 200, _result(msg_id, await self.call(session, params.get("name"), params.get("arguments"),
                                                         params.get("_meta")))
        return 200, _error(msg_id, -32601, "method not found")


#: The one line a ``--notebook`` token gets where no side panel can answer its cards (the daemon, the hub service).
_NO_PANEL = ("this gateway token is for a notebook of a Jupyter server (jupyter relay mcp-token --notebook): its "
             "write cards appear in that server's side panel, and this broker has none; use the Jupyter server's "
             "relay/mcp, or mint a daemon client's token: jupyter relay mcp-token --client NAME")


def _text_result(text: str, is_error: bool) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def _result(msg_id: Any, result: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result}, ensure_ascii=False).encode()


def _error(msg_id: Any, code: int, message: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}).encode()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("relay-jupyter")
    except Exception:
        return "0"


def _presented(headers: Any) -> str:
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _log_request(handler: RequestHandler) -> None:
    """Tornado's access line without the query string (a token put in the URL is never logged)."""
    req = handler.request
    log.debug("%d %s %s (%.1f ms)", handler.get_status(), req.method, req.path, 1000.0 * req.request_time())


_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


class GatewayHandler(RequestHandler):
    """``POST /mcp`` (the loopback listener) and ``{base_url}relay/mcp`` (server/mcp_gateway.py). A bearer
    gateway token only: no cookie, no XSRF, no Jupyter login."""

    gateway: McpGateway
    file_tokens: bool = True
    """Whether ``jupyter relay mcp-token`` tokens open this mount (not the loopback listener: engines only)."""
    panel_answers: bool = True
    """Whether a browser session (the side panel) can answer the cards of a session with no originator (an
    outside client's ``--notebook`` token). False on the daemon and the hub service: there such a token is
    refused in one line rather than left to time out on every write."""

    def initialize(self, gateway: McpGateway | None = None, file_tokens: bool = True, **_: Any) -> None:
        if gateway is not None:
            self.gateway = gateway
        self.file_tokens = file_tokens

    def set_default_headers(self) -> None:
        self.clear_header("Server")
        self.set_header("Cache-Control", "no-store")

    def check_xsrf_cookie(self) -> None:  # a bearer token, never a cookie
        return None

    def _refuse(self, status: int, body: bytes, *, authenticate: bool = False) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        if authenticate:
            self.set_header("WWW-Authenticate", 'Bearer realm="relay"')
        self.finish(body)

    def _session(self) -> GatewaySession | None:
        query = self.request.query_arguments
        if any(k.lower() in ("token", "access_token", "key", "api_key") for k in query):
            self._refuse(400, _error(None, -32600, "a token in the URL is refused: send Authorization: Bearer"))
            return None
        origin = self.request.headers.get("Origin")
        if origin is not None and (urlsplit(origin).hostname or "") not in _LOOPBACK_HOSTS:
            # DNS-rebinding defence (MCP Streamable HTTP: servers must check Origin); a page elsewhere
            # cannot hold a token anyway
            self._refuse(403, _error(None, -32600, "cross-origin requests are refused"))
            return None
        session = self.gateway.authenticate(_presented(self.request.headers), file_tokens=self.file_tokens)
        if session is None:
            self._refuse(401, _UNAUTHORIZED, authenticate=True)
            return None
        if session.originator is None and not self.panel_answers:
            self._refuse(403, _error(None, -32600, _NO_PANEL))
            return None
        return session

    async def post(self) -> None:
        session = self._session()
        if session is None:
            return
        if len(self.request.body) > MAX_BODY_BYTES:
            self._refuse(413, _error(None, -32600, f"the body is over {MAX_BODY_BYTES} bytes"))
            return
        version = self.request.headers.get("MCP-Protocol-Version")
        if version is not None and version not in GATEWAY_PROTOCOL_VERSIONS:
            self._refuse(400, _error(None, -32600, "unsupported MCP-Protocol-Version"))
            return
        try:
            status, answer = await self.gateway.handle(session, self.request.body)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("MCP gateway: internal error")
            status, answer = 200, _error(None, -32603, "Internal error")
        self.set_status(status)
        if answer is None:
            self.finish()
            return
        self.set_header("Content-Type", "application/json")
        self.finish(answer)

    async def get(self) -> None:  # no server-to-client stream: nothing is ever pushed
        if self._session() is None:
            return
        self.set_status(405)
        self.set_header("Allow", "POST")
        self.finish()

    async def delete(self) -> None:  # stateless: there is no session to end
        if self._session() is None:
            return
        self.set_status(405)
        self.set_header("Allow", "POST")
        self.finish()


# -- tokens for outside clients (``jupyter relay mcp-token``) -------------------------------------------------

TOKENS_FILE = "mcp-gateway-tokens.json"


def tokens_file(data_dir: Path) -> Path:
    """``<data dir>/mcp-gateway-tokens.json``: SHA-256 digests of outside clients' tokens -> origin, label, expiry."""
    return Path(data_dir) / TOKENS_FILE


def read_tokens(path: Path) -> dict[str, Any]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {}
    if st.st_mode & 0o077 or st.st_uid != os.getuid():  # a file others could write is not trusted
        log.warning("MCP gateway: %s is readable or writable by others (or not yours); ignored", path)
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_tokens(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(data, indent=1, sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def mint_token(path: Path, origin: str, *, label: str = "client", expires_in: float | None = 30 * 86400.0) -> str:
    """A new outside-client token for ``origin``; only its digest is stored. Returns the token (shown once)."""
    token = _TOKEN_PREFIX + secrets.token_urlsafe(32)
    data = read_tokens(path)
    now = time.time()
    data[hashlib.sha256(token.encode()).hexdigest()] = {
        "origin": origin, "label": label[:64], "created_at": now,
        "expires_at": now + expires_in if expires_in else None}
    _write_tokens(path, data)
    return token


def revoke_tokens(path: Path, *, origin: str | None = None, digest_prefix: str | None = None) -> int:
    """Forget outside-client tokens: of ``origin``, or the one whose digest starts with ``digest_prefix``
    (at least 8 hex digits), or all. Returns how many."""
    data = read_tokens(path)
    keep = {k: v for k, v in data.items()
            if not ((origin is None or v.get("origin") == origin)
                    and (digest_prefix is None or k.startswith(digest_prefix.lower())))}
    gone = len(data) - len(keep)
    if gone:
        _write_tokens(path, keep)
    return gone


_gateways: weakref.WeakKeyDictionary[Any, McpGateway] = weakref.WeakKeyDictionary()


def mcp_gateway_of(broker: Broker) -> McpGateway:
    """The broker's gateway, made on first use (kept beside the broker, as ``tool_sources`` keeps added sources)."""
    gateway = _gateways.get(broker)
    if gateway is None:
        gateway = McpGateway(broker)
        _gateways[broker] = gateway
    return gateway

