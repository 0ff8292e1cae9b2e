"""Who may call a namespace's methods: each method module declares its rule once (``ACCESS``) and
registers its handlers through one :class:`Namespace`, which applies that rule before the handler runs.

A handler is written as ``async def handler(req: Request, params) -> Result``; the function the
namespace registers (and returns, so a test can call it directly) is ``(broker, caller, params)``:
it resolves the origin the call acts on with the namespace's rule, then calls the handler with a
:class:`Request`. No handler can be reached without its rule.

The origin of a call (:class:`Scope`, one per method):

- ``ONE``: a kernel or daemon client acts on its own origin (naming another is ``UNAUTHORIZED``); a
  browser session of the server's user names the origin it acts on (omitting it is ``UNAUTHORIZED``).
- ``ANY``: as ``ONE``, but a browser that names no origin acts on (sees) every origin:
  list methods, and methods that address one object by id (``runs.get``).
- ``ALL``: as ``ONE``, except that ``all: true`` (browser sessions only) means every origin (``kill``); a
  caller that ``stops_all`` (the daemon's terminal client) acts on every origin, or the one it names.

The rules (docs/protocol.md "Access"):

- :data:`NOTEBOOK`: the origin rule above, nothing more (grants, budget, audit, trust, checkpoints,
  workspace, conversations, tools).
- :data:`RUNS` (``run.*``, ``runs.*``, ``kill``): the origin rule, and a run is *acted on* (cancelled)
  by its originator or a browser session only: another client of the same notebook gets
  ``NOT_ORIGINATOR``; a client of another notebook gets ``NOT_FOUND`` (existence is not leaked).
- :data:`ADDRESSEE` (``permission.*``, ``kernel.*``): a request is answered only by the client it was
  sent to (a permission request: its originator, or a browser session); the component that sent it
  (``PermissionRouter``, ``KernelBridge``) holds the addressee and checks it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ...core.caller import Caller, CallerKind
from ...core.errors import Code, GateRefusal, RoutingRefusal
from ...core.redact import redact
from ...core.types import AuditRecord
from ...protocol.names import Method
from ..registry import MethodSpec, register

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["ADDRESSEE", "NOTEBOOK", "RUNS", "Access", "Namespace", "Request", "RunAccess", "Scope"]


class Scope(Enum):
    """The origin a method acts on (see the module docstring)."""

    ONE = "one"
    ANY = "any"
    ALL = "all"


@dataclass(frozen=True)
class Request:
    """One call as its handler sees it: the broker, the authenticated caller and the origin the call
    acts on, resolved by the namespace's rule (``None``: every origin, browser sessions only)."""

    broker: Broker
    caller: Caller
    origin: str | None

    @property
    def target(self) -> str:
        """The one origin of a ``Scope.ONE`` method."""
        if self.origin is None:  # a registration error (Scope.ANY handler using target), never user input
            raise RuntimeError("this method acts on every origin; it has no single target")
        return self.origin

    def sees(self, origin: str | None) -> bool:
        """True when an object of ``origin`` is within this call's scope (every origin of a browser session, a hub
        user's origins for that user's panel: :meth:`Caller.acts_for`)."""
        if self.origin is None:
            return self.caller.acts_for(origin)
        return origin == self.origin

    def reach(self, limit: int, most: int) -> int:
        """How many rows a list method asks its store for: ``limit``, or ``most`` (the method's maximum) for a hub
        user's panel that names no origin, whose rows :meth:`keep` then picks from the service's newest ``most``."""
        return most if self.origin is None and self.caller.kind is CallerKind.PANEL else limit

    def prefix(self, asked: str | None) -> str | None:
        """The origin prefix a list method filters by in its store: ``asked``, which for a hub user's panel must lie
        under its ``user:<name>/`` (else UNAUTHORIZED) and defaults to it, so the store finds her rows however many
        of others' are newer.

        Raises:
            GateRefusal: UNAUTHORIZED for a panel asking another user's prefix.
        """
        own = self.caller.origin_prefix if self.caller.kind is CallerKind.PANEL else None
        if asked is None:
            return own
        if own is not None and not asked.startswith(own):
            raise GateRefusal(Code.UNAUTHORIZED, "a hub user's panel lists only her own origins (user:<name>/...)")
        return asked

    def keep(self, rows: Any) -> list[Any]:
        """``rows`` (dicts or records with an ``origin``) within this call's scope: a list method's answer."""
        if self.origin is not None or self.caller.kind is CallerKind.BROWSER:
            return list(rows)
        return [r for r in rows if self.sees(r.get("origin") if isinstance(r, dict) else getattr(r, "origin", None))]

    def audit(self, action: str, arguments: dict[str, Any], *, origin: str | None = None,
              decision: str = "ok") -> None:
        """Record a control action (arguments redacted) against ``origin`` (default: the call's, ``*``
        for every origin)."""
        self.broker.audit.append(AuditRecord(ts=time.time(), origin=origin or self.origin or "*", tool=action,
                                             decision=decision, answered_by=self.caller.client_id,
                                             arguments=redact(arguments)))


@dataclass(frozen=True)
class Access:
    """An access rule: the origin a call acts on, from the caller and the ``origin`` (and ``all``)
    parameters."""

    name: str
    summary: str

    def origin(self, caller: Caller, params: BaseModel, scope: Scope) -> str | None:
        """The origin the call acts on.

        Raises:
            GateRefusal: UNAUTHORIZED (a kernel naming another origin, a browser naming none for a
                ``ONE`` method, ``all`` from a non-browser caller).
        """
        from ..broker import target_origin

        requested = getattr(params, "origin", None)
        if scope is Scope.ALL and caller.stops_all and caller.kind is not CallerKind.BROWSER:
            return None if getattr(params, "all", False) or requested is None else str(requested)
        if scope is Scope.ALL and getattr(params, "all", False):
            if caller.kind is not CallerKind.BROWSER:
                raise GateRefusal(Code.UNAUTHORIZED, "only a browser session of the server's user can act on "
                                                     "every notebook")
            return None
        if scope is Scope.ANY and caller.sees_many and requested is None:
            return None  # a hub user's panel: every origin *it acts for*; the handler filters (PANEL_FILTERED)
        return target_origin(caller, requested)


@dataclass(frozen=True)
class RunAccess(Access):
    """The origin rule, and the cancel rule of ``run.cancel`` and ``runs.cancel`` (one rule, two methods)."""

    def run(self, req: Request, run_id: str) -> dict[str, Any]:
        """The run as the journal has it, when the caller may see it.

        Raises:
            RoutingRefusal: NOT_FOUND for a missing run and for another notebook's run alike.
        """
        row = req.broker.store.get_run(run_id)
        if row is None or not req.sees(row.get("origin")):
            raise RoutingRefusal(Code.NOT_FOUND, f"no run {run_id}")
        return row

    def cancel(self, req: Request, run_id: str) -> bool:
        """Cancel a run when the caller may: its originator, or a browser session of the server's user.
        False when the run already ended.

        Raises:
            RoutingRefusal: NOT_FOUND (no such run, or another notebook's), NOT_ORIGINATOR (another
                client of the same notebook: a second kernel, a daemon client).
            ConfigRefusal: UNAVAILABLE without the agent runtime.
        """
        from ..broker import require

        runs = require(req.broker.runs, "the agent runtime")
        active = runs.get(run_id)
        if active is not None:
            origin, originator = active["origin"], active["originator"]
        else:
            row = self.run(req, run_id)
            origin, originator = row.get("origin"), (row.get("meta") or {}).get("originator")
        if not req.sees(origin):
            raise RoutingRefusal(Code.NOT_FOUND, f"no run {run_id}")
        if not req.caller.sees_many and originator is not None \
                and originator != req.caller.client_id:
            raise RoutingRefusal(Code.NOT_ORIGINATOR, "only the client that started this run (or the side panel) "
                                                      "can cancel it")
        return bool(runs.cancel(run_id)) if active is not None else False


@dataclass(frozen=True)
class AddresseeAccess(Access):
    """Requests the broker sent to one client (permission requests, kernel-tool requests): the
    component that sent them checks the addressee; the call's origin is the caller's own (browser:
    every origin)."""

    def origin(self, caller: Caller, params: BaseModel, scope: Scope) -> str | None:
        return None if caller.sees_many else caller.origin


NOTEBOOK = Access("notebook", "a kernel or daemon client acts on its own origin; a browser session of the "
                              "server's user names one (list methods: or none, for every origin)")
RUNS = RunAccess("runs", "the notebook rule; a run is cancelled only by its originator or a browser session "
                         "(NOT_ORIGINATOR for another client of the same notebook, NOT_FOUND for another notebook)")
ADDRESSEE = AddresseeAccess("addressee", "a request the broker sent is answered only by the client it was sent "
                                         "to (permission requests: or a browser session)")

Handler = Callable[[Request, Any], Awaitable[BaseModel]]

#: The methods a hub user's panel (:attr:`CallerKind.PANEL`) may call without naming an origin: each keeps only
#: that user's origins (``req.sees`` / ``req.keep``, or the router's ``pending_for`` / ``answer`` of the caller).
#: Any other method, called by a panel without an origin, is UNAUTHORIZED (fail closed: a new list method that
#: takes "no origin" as "every origin" is not reachable by a panel until its handler filters and is listed here).
PANEL_FILTERED = frozenset({
    Method.GRANTS_LIST, Method.GRANTS_DEFAULTS, Method.PERMISSION_ANSWER, Method.PERMISSION_PENDING,
    Method.ELICITATION_ANSWER, Method.ELICITATION_PENDING, Method.RUNS_LIST, Method.RUNS_GET, Method.RUNS_CANCEL,
    Method.RUN_CANCEL, Method.AUDIT_TAIL, Method.TELEMETRY_QUERY, Method.TRUST_LIST, Method.CONVERSATIONS_LIST,
})


class Namespace:
    """The methods of one module: every method name starts with one of ``prefixes`` and is called
    through ``access``. ``rpc = Namespace(ACCESS, "grants")``, then ``@rpc.method(...)``."""

    def __init__(self, access: Access, *prefixes: str) -> None:
        if not prefixes:
            raise ValueError("a namespace needs a prefix")
        self.access = access
        self.prefixes = prefixes
        self.names: list[str] = []

    def owns(self, name: str) -> bool:
        """True when ``name`` belongs to this namespace (``grants`` owns ``grants.get``; ``kill`` owns ``kill``)."""
        return any(name == p or name.startswith(p + ".") for p in self.prefixes)

    def method(self, name: str, params: type[BaseModel], result: type[BaseModel], *, doc: str,
               scope: Scope = Scope.ONE) -> Callable[[Handler], Callable[[Any, Caller, Any], Awaitable[BaseModel]]]:
        """Register ``handler(req, params) -> result`` under ``name`` with this namespace's rule."""
        if not self.owns(name):
            raise RuntimeError(f"RPC method {name!r} is outside the namespace {'/'.join(self.prefixes)}")
        access = self.access

        def decorate(handler: Handler) -> Callable[[Any, Caller, Any], Awaitable[BaseModel]]:
            @functools.wraps(handler)
            async def call(broker: Broker, caller: Caller, model: Any) -> BaseModel:
                origin = access.origin(caller, model, scope)
                if origin is None and caller.kind is CallerKind.PANEL and name not in PANEL_FILTERED:
                    # fail closed: "every origin" reaches a hub user's panel only through a handler that keeps
                    # that user's origins (req.sees); any other method must be given one of them
                    raise GateRefusal(Code.UNAUTHORIZED, "name the origin (notebook) to act on")
                return await handler(Request(broker, caller, origin), model)

            register(MethodSpec(name, params, result, call, doc, access=access, scope=scope.value,
                                namespace=self.prefixes[0]))
            self.names.append(name)
            return call

        return decorate
