"""The broker as a JupyterHub-managed service: one broker for the hub, under its own OS user (issue 15 item 4).

JupyterHub starts it from a ``c.JupyterHub.services`` entry (docs/multi-user.md)::

    c.JupyterHub.services = [{
        "name": "relay",
        "user": "relaysvc",                      # a dedicated system user: the keys live in its files only
        "url": "http://127.0.0.1:10101",
        "command": ["/opt/relay/bin/python", "-m", "relay_jupyter.cli", "hub-service"],
    }]

and gives it, in its environment, ``JUPYTERHUB_SERVICE_NAME``, ``JUPYTERHUB_SERVICE_URL`` (where to
listen), ``JUPYTERHUB_SERVICE_PREFIX`` (``/services/relay/``: the proxy does not strip it),
``JUPYTERHUB_API_URL`` and ``JUPYTERHUB_API_TOKEN`` (the service's own token, never logged).

Who is calling: every request carries a JupyterHub token (``Authorization: token …`` or ``Bearer …``;
the Anthropic endpoint also takes it as ``x-api-key``). :class:`HubGate` asks the hub who it belongs to
(``jupyterhub.services.auth.HubAuth.user_for_token``: ``GET /hub/api/user`` with that token, results
cached ``HUB_AUTH_CACHE_SECONDS``), requires a *user* token holding ``access:services!service=<name>``,
and maps it to the origin ``user:<name>/notebook:<path>`` (``<path>``: the kernel's
``X-Relay-Client: kernel:<notebook>``; any other client name gives ``user:<name>/client:<label>``).
The notebook is a label within one user (all of a user's kernels hold the same token and run as the
same OS user), the user is the boundary: one user's token never acts on another's origins.

Team budgets: a team of ``c.RelayApp.teams`` draws from the members listed there *and* from the members
of the hub group of the same name (the groups come with each token's user model).

A user's single-user server finds the service through ``c.RelayApp.hub_service_url`` or
``$RELAY_HUB_SERVICE_URL`` and becomes a thin client (:func:`install_thin_kernel_env_hook`; no
broker, no keys, no store in the user's server): each kernel gets ``RELAY_URL`` (the service) and
``RELAY_TOKEN`` (the user's own hub token, which its kernels could read from the server anyway).

SIGINT and SIGTERM stop it gracefully (the hub stops services with SIGINT, and a service started from a
non-interactive shell would otherwise ignore it): listener closed, connections closed, pending
permission requests denied, store closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import PeriodicCallback
from tornado.netutil import bind_sockets

from ..broker.assembly import install_components, start_components
from ..broker.broker import Broker
from ..broker.config import BrokerConfig
from ..core.caller import Caller, CallerKind
from ..core.errors import Code, ConfigRefusal
from ..storage.paths import data_dir as default_data_dir
from ..storage.paths import ensure_private_dir
from .daemon_auth import CLIENT_NAME, URL_TOKEN_BODY, AuthLog, url_has_credentials
from ..core.tooling import is_hub_kernel_client
from ..protocol.client_names import ENV_INSTANCE, INSTANCE_HEADER, anonymous_name_for, is_instance
from .kernel_auth import ENV_CREDENTIAL, ENV_URL, scrub_env
from .plain import make_app, refuse, shut_down

__all__ = [
    "ENV_HUB_SERVICE_URL",
    "HUB_AUTH_CACHE_SECONDS",
    "HUB_GROUPS_FILE",
    "HubEnv",
    "HubGate",
    "HubGroupsUnavailable",
    "HubServersUnavailable",
    "KernelClients",
    "OpenRequests",
    "SERVER_CHECK_SECONDS",
    "end_kernels_of_gone_servers",
    "fetch_user_servers",
    "PANEL_HEADER",
    "ThinKernels",
    "fetch_hub_groups",
    "hub_group_members",
    "hub_origin",
    "install_thin_kernel_env_hook",
    "read_hub_groups",
    "run_hub_service",
    "serve_hub_service",
    "thin_client_url",
    "token_server",
]

log = logging.getLogger("relay_jupyter.hub")

#: Where a single-user server finds the hub service when ``c.RelayApp.hub_service_url`` is not set
#: (``c.Spawner.environment = {"RELAY_HUB_SERVICE_URL": "http://127.0.0.1:10101/services/relay/"}``).
ENV_HUB_SERVICE_URL = "RELAY_HUB_SERVICE_URL"
#: How long the hub's answer about a token is reused by default (a revoked token works this long at most;
#: ``jupyter relay hub-service --auth-cache SECONDS``). Short: one hub API call per token per period.
HUB_AUTH_CACHE_SECONDS = 10
#: How often the service checks that the users of kernels with live runs still have a server (:class:`KernelClients`;
#: ``jupyter relay hub-service --server-check SECONDS``).
SERVER_CHECK_SECONDS = 10
_SHUTDOWN_GRACE = 5.0
#: The service's copy of its teams' hub groups (members only, no secret), for the admin commands run as its user
#: (``jupyter relay audit --team``) that have no hub token of their own.
HUB_GROUPS_FILE = "hub_groups.json"
_GROUPS_EVERY_MS = 60_000
#: Sent (value ``1``) by a single-user server's panel proxy: the caller is the token user's side panel, which acts
#: for every origin ``user:<name>/…`` of that user (Caller kind ``panel``). Any process holding the user's token
#: can send it (her kernels too: the same trust as her server, whose token they can read; docs/multi-user.md).
PANEL_HEADER = "X-Relay-Panel"
_PRUNE_EVERY_MS = 3_600_000
_JSON = (("Content-Type", "application/json"), ("Cache-Control", "no-store"))
_HUB_DOWN_BODY = b'{"message": "cannot check the token with JupyterHub right now; retry"}'
_NOT_A_USER_BODY = b'{"message": "a JupyterHub user token is needed (this token belongs to no user)"}'
_SERVER_GONE_BODY = (b'{"message": "this kernel\'s Jupyter server is gone (stopped or killed): its runs were ended; '
                     b'start a kernel on a running server"}')


@dataclass(frozen=True)
class HubEnv:
    """What JupyterHub tells a managed service in its environment."""

    name: str
    api_url: str
    api_token: str = field(repr=False)
    host: str
    port: int
    prefix: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HubEnv:
        """Read ``JUPYTERHUB_SERVICE_NAME``, ``_SERVICE_URL``, ``_SERVICE_PREFIX``, ``_API_URL``, ``_API_TOKEN``.

        Raises:
            ConfigRefusal: CONFIG_INVALID naming the missing or malformed variable (one line).
        """
        env = os.environ if environ is None else environ
        missing = [n for n in ("JUPYTERHUB_SERVICE_NAME", "JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_API_URL",
                               "JUPYTERHUB_API_TOKEN") if not env.get(n, "").strip()]
        if missing:
            raise ConfigRefusal(Code.CONFIG_INVALID,
                                f"hub-service runs as a JupyterHub-managed service: {', '.join(missing)} not set "
                                "(start it from c.JupyterHub.services; docs/multi-user.md)")
        name = env["JUPYTERHUB_SERVICE_NAME"].strip()
        url = env["JUPYTERHUB_SERVICE_URL"].strip()
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            port = None
            parts = None  # type: ignore[assignment]
        if parts is None or parts.scheme != "http" or not parts.hostname or port is None:
            raise ConfigRefusal(Code.CONFIG_INVALID,
                                f"JUPYTERHUB_SERVICE_URL must be http://HOST:PORT (got {url[:80]!r}); give the "
                                "service entry a \"url\"")
        prefix = env.get("JUPYTERHUB_SERVICE_PREFIX", "").strip() or f"/services/{name}/"
        if not prefix.endswith("/"):
            prefix += "/"
        return cls(name=name, api_url=env["JUPYTERHUB_API_URL"].strip(), api_token=env["JUPYTERHUB_API_TOKEN"].strip(),
                   host=parts.hostname, port=port, prefix=prefix)

    @property
    def access_scope(self) -> str:
        """The scope a user's token needs to reach this service."""
        return f"access:services!service={self.name}"


def hub_origin(user: str, client_name: str) -> str:
    """``user:<name>/notebook:<path>`` for a kernel client (``kernel:<path>``), else ``user:<name>/client:<label>``."""
    if client_name.startswith("kernel:") and len(client_name) > len("kernel:"):
        return f"user:{user}/notebook:{client_name[len('kernel:'):]}"
    return f"user:{user}/client:{client_name}"


def _token_of(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() not in ("token", "bearer") or not value or " " in value or len(value) > 512:
        return None
    return value if value.isascii() and value.isprintable() else None


class HubGate:
    """``resolve_caller`` for :func:`relay_jupyter.server.plain.make_app`: a JupyterHub token -> a user's caller.

    No cooldown by peer address (unlike the daemon's TCP gate): every user's kernels share 127.0.0.1, so
    one user's failures would lock every other user out; hub tokens are 32 random bytes, not guessable.
    ``hub_auth`` is a ``jupyterhub.services.auth.HubAuth`` (any object with an async
    ``user_for_token(token, sync=False)``).
    """

    def __init__(self, hub_auth: Any, access_scope: str, *, auth_log: AuthLog | None = None) -> None:
        self.hub_auth = hub_auth
        self.access_scope = access_scope
        self.auth_log = auth_log
        self._groups: dict[str, frozenset[str]] = {}
        self.hub_groups: dict[str, frozenset[str]] = {}
        """The teams' hub groups as the service last fetched them (:func:`fetch_hub_groups`)."""
        self.kernel_clients = KernelClients()
        """The user of each kernel client seen: :func:`end_kernels_of_gone_servers`."""

    def groups_of(self, user: str) -> frozenset[str]:
        """The user's hub groups as last seen with one of their tokens (the fresher answer: every request
        carries one), else as last fetched from the hub API (empty before either)."""
        seen = self._groups.get(user)
        if seen is not None:
            return seen
        return frozenset(g for g, members in self.hub_groups.items() if user in members)

    def _log(self, outcome: str, handler: web.RequestHandler, **extra: Any) -> None:
        if self.auth_log is not None:
            self.auth_log.event(outcome, "hub", {"ip": handler.request.remote_ip or "?"},
                                path=handler.request.path[:200], **extra)

    async def __call__(self, handler: web.RequestHandler) -> Caller | None:
        request = handler.request
        if url_has_credentials(request.query_arguments):
            self._log("refused", handler, reason="token_in_url")
            refuse(handler, 400, URL_TOKEN_BODY, _JSON)
            return None
        token = _token_of(request.headers.get("Authorization"))
        if token is None:
            self._log("refused", handler, reason="missing" if "Authorization" not in request.headers else "malformed")
            return None
        try:
            model = await self.hub_auth.user_for_token(token, sync=False)
        except Exception:  # the hub is down or refused the service itself: fail closed, say so, never a traceback
            log.warning("checking a token with JupyterHub failed", exc_info=log.isEnabledFor(logging.DEBUG))
            refuse(handler, 503, _HUB_DOWN_BODY, _JSON)
            return None
        if not model:
            self._log("refused", handler, reason="wrong")
            return None
        name = model.get("name")
        if model.get("kind", "user") != "user" or not isinstance(name, str) or not name \
                or "/" in name or not name.isprintable() or len(name) > 256:
            self._log("refused", handler, reason="not_a_user")
            refuse(handler, 403, _NOT_A_USER_BODY, _JSON)
            return None
        if not self._has_scope(model):
            self._log("refused", handler, reason="scope")
            refuse(handler, 403, json.dumps({"message": f"this token lacks the scope {self.access_scope}"}).encode(),
                   _JSON)
            return None
        client = request.headers.get("X-Relay-Client", "default")
        if not CLIENT_NAME.match(client):
            refuse(handler, 400, b'{"message": "X-Relay-Client must be 1-64 of [A-Za-z0-9_.:-]"}', _JSON)
            return None
        groups = model.get("groups")
        if isinstance(groups, list):
            self._groups[name] = frozenset(g for g in groups if isinstance(g, str))
        if request.headers.get(PANEL_HEADER) is not None:
            if request.headers.get(PANEL_HEADER) != "1":
                refuse(handler, 400, b'{"message": "X-Relay-Panel must be 1"}', _JSON)
                return None
            # the user's side panel, through her own server's proxy (server/hub_panel_proxy.py): every origin of
            # this user, none of another's; its client id cannot be a kernel's ('#' is no client-name character)
            return Caller(kind=CallerKind.PANEL, origin=None, client_id=f"user:{name}/#panel:{client}", user=name,
                          origin_prefix=f"user:{name}/")
        instance = request.headers.get(INSTANCE_HEADER)
        if instance is not None and not is_instance(instance):
            refuse(handler, 400, b'{"message": "X-Relay-Instance must be 16 lowercase hex digits"}', _JSON)
            return None
        origin = hub_origin(name, client)
        # a thin server's kernel: its instance id is part of its client id (not of its origin), so two kernels of
        # one notebook name are two originators and kernel.ended of one touches only its own runs and cards
        client_id = f"user:{name}/{client}" + (f"#{instance}" if instance else "")
        if is_hub_kernel_client(client_id):
            if self.kernel_clients.is_gone(client_id):  # its server is gone: its orphaned process starts nothing
                self._log("refused", handler, reason="server_gone")
                refuse(handler, 410, _SERVER_GONE_BODY, _JSON)
                return None
            self.kernel_clients.seen(client_id, name, token_server(model, name))
        return Caller(kind=CallerKind.DAEMON, origin=origin, client_id=client_id, user=name)

    def _has_scope(self, model: Mapping[str, Any]) -> bool:
        from jupyterhub.services.auth import check_scopes

        scopes = model.get("scopes")
        if not isinstance(scopes, list):
            return False
        return bool(check_scopes({self.access_scope}, set(scopes)))


class KernelClients:
    """The user and server of each kernel client the service has seen (client id -> hub user name, the server its
    token names, when it was first seen; no token is kept).

    Why: a kernel's runs end when its thin server says so (``kernel.ended``), but a server that is killed (SIGKILL,
    out of memory) says nothing. The hub notices (its poll, ``c.Spawner.poll_interval``) and drops the server from
    the user's model; :func:`end_kernels_of_gone_servers` asks the hub about the users of kernel clients with live
    runs. (The server's API token is no sign: JupyterHub 6 keeps it valid after the server stopped.) A single-user
    server's token names its server (:func:`token_server`), so a client of a named server is ended when that server
    is gone even while the user has others. At most :attr:`MAX` clients, the least recently seen dropped first; at
    most :attr:`MAX` ended ones are remembered (:meth:`is_gone`).
    """

    MAX = 10_000

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        import time

        self._clock = clock or time.time
        self._users: dict[str, tuple[str, str | None, float]] = {}
        self._bound: set[str] = set()
        self._gone: dict[str, None] = {}

    def seen(self, client_id: str, user: str, server: str | None = None) -> None:
        """A request of ``client_id`` (of ``user``, with a token of her server ``server``; None: a token that names
        no single server, such as a personal one)."""
        known = self._users.pop(client_id, None)
        first = known[2] if known is not None and known[:2] == (user, server) else self._clock()
        self._users[client_id] = (user, server, first)
        while len(self._users) > self.MAX:
            self._bound.discard(old := next(iter(self._users)))
            del self._users[old]

    def user_of(self, client_id: str) -> str | None:
        known = self._users.get(client_id)
        return known[0] if known is not None else None

    def server_of(self, client_id: str) -> str | None:
        """The server (``""``: the default one) the client's token belongs to, or None when it names none."""
        known = self._users.get(client_id)
        return known[1] if known is not None else None

    def first_seen(self, client_id: str) -> float | None:
        """When the client first came with its current user and server (epoch seconds)."""
        known = self._users.get(client_id)
        return known[2] if known is not None else None

    def bind(self, client_id: str) -> None:
        """For a client whose token names no server: a check saw its user with a server while the client had
        something live: from now on, that user having no server means the client's server is gone. (A client never
        seen so, such as a script with a personal token, is never ended by the check.)"""
        if client_id in self._users:
            self._bound.add(client_id)

    def bound(self, client_id: str) -> bool:
        return client_id in self._bound

    def forget(self, client_id: str) -> None:
        self._users.pop(client_id, None)
        self._bound.discard(client_id)

    def end(self, client_id: str) -> None:
        """Its server is gone: forget it, and refuse its later requests when its token named that server and it is
        one kernel instance (``…#<instance>``: a thin server gives every kernel its own, so no new kernel ever has
        this id). A client without one could be a new kernel of the same name, one whose token names no server a
        script of the user's: those are only forgotten."""
        named = self.server_of(client_id) is not None
        self.forget(client_id)
        if named and "#" in client_id:
            self._gone[client_id] = None
            while len(self._gone) > self.MAX:
                del self._gone[next(iter(self._gone))]

    def is_gone(self, client_id: str) -> bool:
        return client_id in self._gone


def token_server(model: Mapping[str, Any], user: str) -> str | None:
    """The single-user server a token belongs to, from its scopes: a server's own token
    (``$JUPYTERHUB_API_TOKEN``, ``c.Spawner.server_token_scopes`` with ``access:servers!server``) holds exactly one
    ``access:servers!server=<user>/<server name>`` (``""``: the default server). None for a token holding none or
    several of its user's (a personal token: ``self`` gives ``access:servers!user=<user>``)."""
    scopes = model.get("scopes")
    if not isinstance(scopes, list):
        return None
    prefix = f"access:servers!server={user}/"
    names = {s[len(prefix):] for s in scopes if isinstance(s, str) and s.startswith(prefix)}
    return names.pop() if len(names) == 1 else None


def server_started(model: Any) -> float | None:
    """A server model's ``started`` (ISO 8601 UTC, when its spawn began) as epoch seconds, or None."""
    from datetime import datetime, timezone

    value = model.get("started") if isinstance(model, dict) else None
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


#: Why a kernel's runs ended when its user has no server any more (the permission.resolved ``reason``).
SERVER_GONE = "lost its server"


#: What :func:`_hub_model` returns for a user or group the hub does not have (404).
_NO_SUCH: Any = object()


def _hub_model(api_url: str, token: str, kind: str, name: str, *, timeout: float,
               error: Callable[[str], Exception], role: str) -> Any:
    """``GET <api_url>/<kind>s/<name>`` of the hub's REST API as JSON, or :data:`_NO_SUCH` on a 404. Blocking
    (urllib). Raises ``error(reason)`` (one line, never the token) when the hub is unreachable, refuses the
    token (403: the service's role lacks ``role``) or answers what is not JSON."""
    import urllib.error
    import urllib.parse
    import urllib.request

    base = api_url.rstrip("/")
    req = urllib.request.Request(f"{base}/{kind}s/{urllib.parse.quote(name, safe='')}",
                                 headers={"Authorization": f"token {token}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return _NO_SUCH
        raise error(f"the hub answered {exc.code} for {kind} {name[:64]!r}"
                    + (f"; give the service a role with {role}" if exc.code == 403 else "")) from None
    except (OSError, ValueError) as exc:
        raise error(f"the hub API at {base[:120]} is unreachable ({type(exc).__name__})") from None


class HubServersUnavailable(Exception):
    """The hub did not say which servers a user has; ``reason`` is one line without the token."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fetch_user_servers(api_url: str, token: str, user: str, *, timeout: float = 10.0) -> dict[str, Any] | None:
    """The user's servers as the hub sees them (``GET <api_url>/users/<name>``, its ``servers``: name -> model), or
    None when the hub has no such user. Blocking (urllib): the service calls it in a thread.

    Raises:
        HubServersUnavailable: the hub is unreachable, refuses the token, or answers without ``servers`` (the
            service's role lacks ``read:servers``).
    """
    model = _hub_model(api_url, token, "user", user, timeout=timeout, error=HubServersUnavailable,
                       role="read:servers")
    if model is _NO_SUCH:
        return None
    servers = model.get("servers") if isinstance(model, dict) else None
    if not isinstance(servers, dict):
        raise HubServersUnavailable("the hub's user model has no servers; give the service a role with read:servers")
    return servers


async def end_kernels_of_gone_servers(broker: Broker, gate: HubGate, api_url: str, token: str,
                                      requests: OpenRequests | None = None) -> dict[str, dict[str, Any]]:
    """End the runs and withdraw the pending requests of every kernel client whose single-user server is gone
    (stopped, or killed and noticed by the hub's poll), as ``kernel.ended`` would.

    Only the users of kernel clients with something live (an active run, a pending request, or a model request
    still open in ``requests``: a kernel's SDK client) are asked about, once per sweep each. A client whose token
    names its server (:func:`token_server`: a thin server's kernels) is ended when the hub no longer lists that
    server for her, or lists one started after the client first came (the server was restarted: the client is a
    leftover of the killed one), whatever other servers she has, and from then on refused (:meth:`KernelClients.end`).
    A client whose token names none keeps the old rule: while she has any server it is bound to having one
    (:meth:`KernelClients.bind`), and once she has none her bound clients are ended. A hub that does not answer
    changes nothing: nothing is withdrawn on a guess (but a client already ended that has something live again, a
    request that was past the gate when it ended, is ended again without asking). An ended client's open requests
    (its SDK client's streams, its event stream) are closed: a model stream stops and settles what it used. Returns
    ``{client_id: what end_kernel did}`` for the clients ended."""
    live = set(broker.permissions.pending_originators()) | (requests.model_clients() if requests else set())
    runs = getattr(broker, "runs", None)
    if runs is not None:
        live |= {s["originator"] for s in runs.active_runs() if isinstance(s.get("originator"), str)}
    clients = gate.kernel_clients
    ended: dict[str, dict[str, Any]] = {}
    for client_id in sorted(c for c in live if clients.is_gone(c)):  # a request already past the gate when it ended
        ended[client_id] = _end_gone(broker, client_id, requests)
    by_user: dict[str, list[str]] = {}
    for client_id in sorted(c for c in live if is_hub_kernel_client(c) and c not in ended):
        user = clients.user_of(client_id)
        if user is not None:
            by_user.setdefault(user, []).append(client_id)
    for user, mine in sorted(by_user.items()):
        servers = await asyncio.to_thread(fetch_user_servers, api_url, token, user)  # raises: nothing withdrawn
        for client_id in mine:
            server = clients.server_of(client_id)
            if server is None:  # a token that names no server: any server of hers may be the client's
                if servers:
                    clients.bind(client_id)
                    continue
                if not clients.bound(client_id):
                    continue
            else:
                model = (servers or {}).get(server)
                started, first = server_started(model), clients.first_seen(client_id)
                if model is not None and (started is None or first is None or started <= first):
                    continue  # its server is there, and was already when the client first came
            clients.end(client_id)
            ended[client_id] = result = _end_gone(broker, client_id, requests)
            log.info("relay hub service: the server of kernel client %s (%s) is gone: %d run(s) cancelled, %d "
                     "permission request(s) withdrawn", client_id, user, len(result["cancelled_runs"]),
                     len(result["withdrawn"]))
    return ended


def _end_gone(broker: Broker, client_id: str, requests: OpenRequests | None) -> dict[str, Any]:
    from ..broker.kernel_bridge import end_kernel

    result = end_kernel(broker, client_id, SERVER_GONE)
    if requests is not None:
        result = {**result, "closed_requests": requests.close(client_id)}
    return result


class OpenRequests:
    """The requests the service is answering (its ``make_app`` activity), so that the requests of a kernel whose
    server is gone can be found: its SDK client's model requests carry its instance id (``X-Relay-Instance``,
    kernel/sdk_clients.py), so they have the kernel's client id."""

    def __init__(self) -> None:
        self._open: set[web.RequestHandler] = set()

    def started(self, handler: web.RequestHandler) -> None:
        self._open.add(handler)

    def ended(self, handler: web.RequestHandler) -> None:
        self._open.discard(handler)

    @staticmethod
    def _client(handler: web.RequestHandler) -> str | None:
        caller = getattr(handler, "relay_caller", None)
        return caller.client_id if caller is not None else None

    def model_clients(self) -> set[str]:
        """The client ids with a model request (``relay/anthropic``, ``relay/openai``) open."""
        from .model_endpoint import ModelEndpoint

        return {c for h in self._open if isinstance(h, ModelEndpoint) and (c := self._client(h)) is not None}

    def close(self, client_id: str) -> int:
        """Close the connections of the open model requests and event streams of ``client_id`` (an RPC still open,
        such as a ``tools.call`` waiting on its card, gets its answer instead: the card was withdrawn); returns how
        many."""
        from .model_endpoint import ModelEndpoint
        from .plain import PlainEventsHandler

        closed = 0
        for handler in [h for h in self._open if self._client(h) == client_id
                        and isinstance(h, ModelEndpoint | PlainEventsHandler)]:
            self._open.discard(handler)
            connection = handler.request.connection
            if connection is not None:
                connection.close()
                closed += 1
        return closed


def make_hub_auth(env: HubEnv, cache_seconds: int = HUB_AUTH_CACHE_SECONDS) -> Any:
    """A ``HubAuth`` for the service's own token and API URL."""
    from jupyterhub.services.auth import HubAuth

    return HubAuth(api_token=env.api_token, api_url=env.api_url, cache_max_age=cache_seconds)


# --------------------------------------------------------------------------------------- the service process

class _HubService:
    def __init__(self, config: BrokerConfig, env: HubEnv, auth_cache: int = HUB_AUTH_CACHE_SECONDS,
                 server_check: int = SERVER_CHECK_SECONDS) -> None:
        self.config = config
        self.env = env
        self.auth_cache = auth_cache
        self.server_check = server_check
        self._checking = False
        self._servers_warned: str | None = None
        self.requests = OpenRequests()
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        os.umask(0o077)  # the service user's files (store, audit, logs) are its own
        config = self.config
        root = ensure_private_dir(Path(config.data_dir)) if config.data_dir else default_data_dir()
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[relay %(levelname)s] %(message)s"))
        top = logging.getLogger("relay_jupyter")
        top.setLevel(logging.INFO)
        top.addHandler(handler)
        auth_log = AuthLog(ensure_private_dir(root / "logs") / "auth.jsonl")
        if not config.in_memory:
            config = config.model_copy(update={"data_dir": root, "audit_file": "audit-hub.jsonl"})
        gate = HubGate(make_hub_auth(self.env, self.auth_cache), self.env.access_scope, auth_log=auth_log)
        broker: Broker | None = None
        server: HTTPServer | None = None
        groups_poll: PeriodicCallback | None = None
        try:
            try:
                socks = bind_sockets(self.env.port, address=self.env.host, family=socket.AF_UNSPEC)
            except OSError as exc:
                raise ConfigRefusal(Code.CONFIG_INVALID, f"cannot listen on {self.env.host}:{self.env.port}: "
                                                         f"{exc.strerror}") from None
            try:
                broker = Broker.open(config)
            except BaseException:
                for sock in socks:
                    sock.close()
                raise
            if config.teams:  # a hub group is the team of the same name; limits set from the terminal hold
                from ..core.teams import Teams, teams_for_origin
                from ..storage.team_limits import team_limits_source

                limits = team_limits_source(Teams.from_config(config.teams), broker.store, config)
                broker.ledger.use_teams(teams_for_origin(limits, None, gate.groups_of), broker.store.transaction)
                groups_poll = PeriodicCallback(lambda: asyncio.ensure_future(self.refresh_groups(gate, root)),
                                               _GROUPS_EVERY_MS)
                await self.refresh_groups(gate, root)
                groups_poll.start()
            # the service cannot write the users' files (another OS user): pushes land in its own directory
            workspace_root = ensure_private_dir(root / "hub-root")
            install_components(broker, jupyter_root=workspace_root)
            self.mcp_start = asyncio.ensure_future(start_components(broker))
            app = make_app(broker, gate, prefix=self.env.prefix + "relay/", activity=self.requests)
            server = HTTPServer(app)
            server.add_sockets(socks)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stopping.set)
            pruner = PeriodicCallback(broker.prune_events, _PRUNE_EVERY_MS)
            pruner.start()
            # a killed single-user server sends no kernel.ended: its kernels' runs end when its token is gone
            servers_check = PeriodicCallback(lambda: asyncio.ensure_future(self.check_servers(broker, gate)),
                                             self.server_check * 1000)
            servers_check.start()
            address = f"http://{self.env.host}:{self.env.port}{self.env.prefix}relay/"
            log.info("relay hub service %r (pid %d, user %s) listening on %s; data in %s", self.env.name,
                     os.getpid(), _login(), address, root)
            print(f"relay hub service listening on {address}", flush=True)
            await self.stopping.wait()
            pruner.stop()
            servers_check.stop()
            if groups_poll is not None:
                groups_poll.stop()
            log.info("relay hub service stopping (signal)")
        finally:
            await shut_down(server, broker, grace=_SHUTDOWN_GRACE)
            auth_log.close()
            top.removeHandler(handler)
        return 0


    async def check_servers(self, broker: Broker, gate: HubGate) -> None:
        """One sweep of :func:`end_kernels_of_gone_servers` at a time (a slow hub must not pile them up)."""
        if self._checking:
            return
        self._checking = True
        try:
            await end_kernels_of_gone_servers(broker, gate, self.env.api_url, self.env.api_token, self.requests)
            self._servers_warned = None
        except HubServersUnavailable as exc:  # one warning per kind of failure; nothing withdrawn
            if self._servers_warned != exc.reason:
                self._servers_warned = exc.reason
                log.warning("relay hub service: cannot see the users' servers (%s); the runs of kernels whose server "
                            "was killed end by their consent timeout", exc.reason)
        except Exception:  # a sweep that failed is logged; the next one runs
            log.warning("relay hub service: checking the kernels' servers failed", exc_info=True)
        finally:
            self._checking = False

    async def refresh_groups(self, gate: HubGate, root: Path) -> None:
        """Fetch the hub groups named like the service's teams (the service's role needs ``read:groups``),
        hand them to the gate and write :data:`HUB_GROUPS_FILE`. A failure is one warning line (the first of a
        kind); the last good copy stays."""
        names = sorted(self.config.teams)
        try:
            groups = await asyncio.to_thread(fetch_hub_groups, self.env.api_url, self.env.api_token, names)
        except HubGroupsUnavailable as exc:
            if getattr(self, "_groups_warned", None) != exc.reason:
                self._groups_warned = exc.reason
                log.warning("relay hub service: cannot read the teams' hub groups (%s); team members from tokens "
                            "only, `jupyter relay audit --team` sees the configured members", exc.reason)
            return
        self._groups_warned = None
        gate.hub_groups = groups
        try:
            write_hub_groups(root / HUB_GROUPS_FILE, groups)
        except OSError as exc:
            log.warning("relay hub service: cannot write %s: %s", HUB_GROUPS_FILE, exc.strerror)


def _login() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


async def serve_hub_service(config: BrokerConfig, env: HubEnv | None = None, *,
                            auth_cache: int = HUB_AUTH_CACHE_SECONDS, server_check: int = SERVER_CHECK_SECONDS) -> int:
    """Run the hub service until SIGINT/SIGTERM. Returns the exit status."""
    return await _HubService(config, env or HubEnv.from_env(), auth_cache, server_check).run()


def run_hub_service(config: BrokerConfig, env: HubEnv | None = None, *,
                    auth_cache: int = HUB_AUTH_CACHE_SECONDS, server_check: int = SERVER_CHECK_SECONDS) -> int:
    """Blocking :func:`serve_hub_service`."""
    hub_env = env or HubEnv.from_env()  # refuse a missing hub environment before anything starts
    return asyncio.run(serve_hub_service(config, hub_env, auth_cache=auth_cache, server_check=server_check))


# --------------------------------------------------------------------------------- the thin client (user side)

def thin_client_url(configured: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The hub service's base URL (``…/services/<name>/``) a single-user server should use, or None.

    ``configured`` (``c.RelayApp.hub_service_url``) wins over ``$RELAY_HUB_SERVICE_URL``.

    Raises:
        ConfigRefusal: CONFIG_INVALID for a URL that is not ``http(s)://host[:port]/path/``.
    """
    env = os.environ if environ is None else environ
    url = (configured or env.get(ENV_HUB_SERVICE_URL, "")).strip()
    if not url:
        return None
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query \
            and not parts.username and (parts.port or True)
    except ValueError:
        ok = False
    if not ok:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"hub_service_url must be http://host:port/services/<name>/ "
                                                 f"(got {url[:80]!r})")
    return url if url.endswith("/") else url + "/"


def install_thin_kernel_env_hook(kernel_manager: Any, service_url: str, *, token: Callable[[], str | None],
                                 secret_names: Iterable[str], secret_values: Callable[[], Iterable[str]],
                                 kernels: ThinKernels | None = None) -> None:
    """Wrap ``kernel_manager.start_kernel``: every new kernel gets a scrubbed environment with ``RELAY_URL``
    (``<service_url>relay/``) and ``RELAY_TOKEN`` (``token()``: the user's hub token), so the kernel's
    ``%%agent`` talks to the hub service (kernel/discovery.py: ``RELAY_URL`` + ``RELAY_TOKEN`` -> Bearer).

    No kernel credential is issued: the service authenticates the user's hub token, not a kernel.
    ``kernels`` (a :class:`ThinKernels`) learns the ``X-Relay-Client`` name each kernel will use."""
    original = kernel_manager.start_kernel
    if getattr(original, "_relay_wrapped", False):
        return
    names = tuple(secret_names)

    async def start_kernel(*args: Any, **kwargs: Any) -> str:
        kernel_id = kwargs.get("kernel_id")
        if kernel_id is not None and kernel_id in kernel_manager:
            return await original(*args, **kwargs)
        base = kwargs.get("env")
        env = scrub_env(os.environ if base is None else base, names=names, values=secret_values())
        env.pop(ENV_CREDENTIAL, None)
        env[ENV_URL] = service_url + "relay/"
        # this kernel's own id at the service (its client id, not its origin): protocol/client_names.ENV_INSTANCE
        env[ENV_INSTANCE] = secrets.token_hex(8)
        value = token()
        if value:
            env["RELAY_TOKEN"] = value
        kwargs["env"] = env
        started = await original(*args, **kwargs)
        if kernels is not None:
            kernels.started(started, env)
        return started

    start_kernel._relay_wrapped = True  # type: ignore[attr-defined]
    kernel_manager.start_kernel = start_kernel


class ThinKernels:
    """The thin client's half of "kernel lifetime" (issue 12): the single-user broker ends a kernel's runs and
    withdraws its pending permission requests the moment its kernel manager restarts, shuts down or loses the
    kernel; a thin server has no broker, so it tells the hub service (``kernel.ended``, with the user's hub
    token and the kernel's own ``X-Relay-Client``: the service acts on that client id of that user only).

    The kernel's client name is computed from the environment it was started with, as the kernel computes it
    (``protocol.client_names``: ``RELAY_NOTEBOOK``, else ``JPY_SESSION_NAME``; without either,
    ``kernel:anon-<its instance>``), and sent with the kernel's instance id (``X-Relay-Instance``): the service's
    client id of the kernel is both, so ending one kernel never ends another kernel's runs of the same notebook.
    """

    def __init__(self, service_url: str, token: Callable[[], str | None]) -> None:
        self.rpc_url = service_url + "relay/rpc"
        self.token = token
        self._names: dict[str, str] = {}
        self._tasks: set[asyncio.Future[Any]] = set()

    def started(self, kernel_id: str, env: Mapping[str, str]) -> None:
        from ..protocol.client_names import client_name_for, kernel_instance, notebook_of_env

        if not isinstance(kernel_id, str):
            return
        path = notebook_of_env(env)
        instance = kernel_instance(env)
        if path:
            self._names[kernel_id] = (client_name_for(path), instance)
        elif instance:  # the kernel names itself after its instance (kernel/discovery.py)
            self._names[kernel_id] = (anonymous_name_for(instance), instance)

    def client_name(self, kernel_id: str) -> str | None:
        named = self._names.get(kernel_id)
        return named[0] if named else None

    def instance(self, kernel_id: str) -> str | None:
        named = self._names.get(kernel_id)
        return named[1] if named else None

    def ended(self, kernel_id: str, reason: str) -> None:
        """The lifecycle hook's ``on_end``: tell the service, in the background (never blocks the kernel action).
        The kernel's name is kept unless it was shut down: a restarted kernel, and one that died and that the restarter
        starts again, run on with the same environment (the same instance id), so their next end is told too."""
        named = self._names.pop(kernel_id, None) if reason == "shut down" else self._names.get(kernel_id)
        if named is None:
            return
        task = asyncio.ensure_future(self.tell(named[0], reason, instance=named[1]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def tell(self, client_name: str, reason: str, *, instance: str | None = None) -> dict[str, Any] | None:
        """POST ``kernel.ended`` for ``client_name`` (and its ``instance``); the result, or None (logged in one line)
        when it failed."""
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        value = self.token()
        if not value:
            log.warning("relay: cannot tell the hub service that a kernel %s: no JUPYTERHUB_API_TOKEN", reason)
            return None
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "kernel.ended", "params": {"reason": reason}})
        headers = {"Authorization": f"token {value}", "X-Relay-Client": client_name, "Content-Type": "application/json"}
        if instance:
            headers[INSTANCE_HEADER] = instance
        try:
            response = await AsyncHTTPClient().fetch(self.rpc_url, method="POST", body=body, request_timeout=30,
                                                     headers=headers)
            reply = json.loads(response.body)
        except (HTTPClientError, OSError, ValueError) as exc:
            log.warning("relay: telling the hub service that kernel %s %s failed: %s", client_name, reason,
                        getattr(exc, "code", None) or type(exc).__name__)
            return None
        result = reply.get("result") if isinstance(reply, dict) else None
        if not isinstance(result, dict):
            log.warning("relay: the hub service refused kernel.ended for %s: %s", client_name,
                        (reply.get("error") or {}).get("message", "?") if isinstance(reply, dict) else "?")
            return None
        if result.get("withdrawn") or result.get("cancelled_runs"):
            log.info("relay: kernel %s %s: %d run(s) cancelled, %d permission request(s) withdrawn by the hub "
                     "service", client_name, reason, len(result.get("cancelled_runs") or ()), result["withdrawn"])
        return result

    async def drain(self) -> None:
        """Wait for the messages still being sent (server shutdown)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


# ------------------------------------------------------------------------------------ hub groups (the teams)

class HubGroupsUnavailable(Exception):
    """The hub's groups could not be read; ``reason`` is one line without the token."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fetch_hub_groups(api_url: str, token: str, names: Iterable[str], *, timeout: float = 10.0
                     ) -> dict[str, frozenset[str]]:
    """The members of each hub group in ``names`` (``GET <api_url>/groups/<name>`` with ``token``; a group the hub
    does not have is left out). Blocking (urllib): the CLI calls it as is, the service in a thread.

    Raises:
        HubGroupsUnavailable: the hub is unreachable, refuses the token (a service role without ``read:groups``:
            403) or answers garbage.
    """
    out: dict[str, frozenset[str]] = {}
    for name in names:
        model = _hub_model(api_url, token, "group", name, timeout=timeout, error=HubGroupsUnavailable,
                           role="read:groups")
        if model is _NO_SUCH:
            continue
        users = model.get("users") if isinstance(model, dict) else None
        if not isinstance(users, list):
            raise HubGroupsUnavailable(f"the hub's model of group {name[:64]!r} has no users list")
        out[name] = frozenset(u for u in users if isinstance(u, str))
    return out


def write_hub_groups(path: Path, groups: Mapping[str, Iterable[str]]) -> None:
    """Write the groups' members to ``path`` (0600, atomic): names only, never a token."""
    import time

    data = {"fetched_at": time.time(), "groups": {g: sorted(m) for g, m in sorted(groups.items())}}
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def read_hub_groups(path: Path) -> dict[str, frozenset[str]] | None:
    """The groups :func:`write_hub_groups` wrote, or None (no file, or not one the service wrote)."""
    try:
        data = json.loads(path.read_text())
        groups = data["groups"]
        return {str(g): frozenset(str(u) for u in members) for g, members in groups.items()
                if isinstance(members, list)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def hub_group_members(team: str, data_dir: Path | None, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The members of the hub group ``team``, for an admin command: live from the hub API when it runs with a hub
    token (``JUPYTERHUB_API_URL`` + ``JUPYTERHUB_API_TOKEN``: as the hub service, or a hub-managed admin service),
    else from the copy the running service keeps in its data dir (:data:`HUB_GROUPS_FILE`), else none.

    Raises:
        HubGroupsUnavailable: a hub token is set but the hub refused or did not answer (never a silent fallback).
    """
    env = os.environ if environ is None else environ
    url, token = env.get("JUPYTERHUB_API_URL", "").strip(), env.get("JUPYTERHUB_API_TOKEN", "").strip()
    if url and token:
        return fetch_hub_groups(url, token, [team]).get(team, frozenset())
    if data_dir is None:
        return frozenset()
    return (read_hub_groups(Path(data_dir) / HUB_GROUPS_FILE) or {}).get(team, frozenset())
