"""Relay's Anthropic endpoint for an engine's own subprocess (the ``claude`` CLI of the claude-code engine).

The engine's CLI makes its own model requests; they must meet the gate like every other request
(grant, model allowlists, rate/token/cost budgets, audit ``purpose: proxy``). So the CLI's
``ANTHROPIC_BASE_URL`` points here: the same :class:`~relay_jupyter.broker.anthropic_proxy.AnthropicProxy`
as ``relay/anthropic/v1/...`` (docs/proxy.md), served on a loopback port of its own because an engine
runs in the daemon too (which may have only a Unix socket) and must not need the Jupyter server's URL,
token or a kernel's credential.

Who may call: the holder of a **per-run key** (``x-api-key`` or ``Authorization: Bearer``), minted by
:meth:`EngineEndpoint.session` for one run, bound to that run's origin, and revoked when the run ends.
Keys are kept and compared as the MCP gateway's tokens are (``broker/run_keys.KeyRing``: SHA-256 digests,
constant time); a missing or wrong key is a 401 in the Messages API's shape. The listener binds 127.0.0.1
only and starts on first use.

Hand-written on tornado (already the server's HTTP stack) rather than mounting ``server/anthropic_endpoint``:
the broker layer must not import the server layer, and this needs only the three routes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from tornado.iostream import StreamClosedError
from tornado.web import RequestHandler

from ..core.budgets import RunBudget
from ..core.errors import GateRefusal
from .anthropic_proxy import MAX_BODY_BYTES, AnthropicProxy, ProxyError, anthropic_error_body
from .profiles import PROFILE_HEADER
from .run_keys import KeyRing, listen_loopback

__all__ = ["EngineEndpoint", "EngineSession"]

log = logging.getLogger(__name__)


@dataclass
class EngineSession:
    """One run's access: ``base_url`` and ``key`` go into the engine subprocess's environment."""

    base_url: str
    key: str
    origin: str
    run_id: str
    on_refusal: Callable[[str, str], None] | None = None
    requests: int = 0
    refusals: int = 0
    profile: str | None = None
    """The run's profile (``%%agent --profile``): every request of the run goes to that profile's upstream, whatever
    header the client sends (``X-Relay-Profile`` is set to it, or dropped when the run names none)."""
    run_budget: RunBudget | None = None
    """The grant's per-run caps (``max_steps_per_run``, ``max_tokens_per_run``) of this run: the proxy serves
    many clients and knows no run, so this endpoint hands them to it with every request of the run (each
    request's reservation is checked against the tokens the run used, its charge is counted in)."""


class EngineEndpoint:
    """A loopback listener serving relay's Anthropic endpoint to engine subprocesses, one key per run."""

    def __init__(self, broker: Any, *, proxy: AnthropicProxy | None = None) -> None:
        self.broker = broker
        self.proxy = proxy or AnthropicProxy(broker)
        self._sessions: KeyRing[EngineSession] = KeyRing()
        self._server: Any = None
        self._port: int | None = None

    def _start(self) -> int:
        if self._port is None:
            from tornado.web import Application

            app = Application([(r"/v1/messages", _Messages, {"endpoint": self}),
                               (r"/v1/messages/count_tokens", _CountTokens, {"endpoint": self}),
                               (r"/v1/models", _Models, {"endpoint": self})])
            self._server, self._port = listen_loopback(app, MAX_BODY_BYTES)
        return self._port

    @asynccontextmanager
    async def session(self, origin: str, run_id: str, on_refusal: Callable[[str, str], None] | None = None,
                      profile: str | None = None) -> AsyncIterator[EngineSession]:
        """A key for one run, valid inside the ``async with``; ``profile``: the upstream of all its requests."""
        port = self._start()
        key = KeyRing.new_key("relay-run-")
        try:
            run_budget: RunBudget | None = self.broker.gate.run_budget(origin)
        except GateRefusal:  # no grant: the proxy refuses every request anyway
            run_budget = None
        session = EngineSession(f"http://127.0.0.1:{port}", key, origin, run_id, on_refusal, profile=profile,
                                run_budget=run_budget)
        self._sessions.add(key, session)
        try:
            yield session
        finally:
            self._sessions.pop(key)

    def problem(self) -> str | None:
        """Why this endpoint cannot forward (no Anthropic key for the broker, a refused URL), or None."""
        try:
            self.proxy._resolve_upstream()
        except ProxyError as exc:
            return exc.message
        except Exception as exc:  # e.g. a ConfigRefusal of the endpoint policy
            return str(getattr(exc, "message", exc))
        return None

    def authenticate(self, presented: str) -> EngineSession | None:
        return self._sessions.find(presented)

    async def aclose(self) -> None:
        self._sessions.clear()
        if self._server is not None:
            self._server.stop()
            self._server, self._port = None, None
        await self.proxy.aclose()


def _presented(headers: Any) -> str:
    key = headers.get("x-api-key", "").strip()
    if key:
        return key
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


class _Base(RequestHandler):
    endpoint: EngineEndpoint
    session: EngineSession | None

    def initialize(self, endpoint: EngineEndpoint) -> None:
        self.endpoint = endpoint
        self.session = None

    def set_default_headers(self) -> None:
        self.clear_header("Server")

    def check_xsrf_cookie(self) -> None:  # an API key, never a cookie
        return None

    def prepare(self) -> None:
        self.session = self.endpoint.authenticate(_presented(self.request.headers))
        if self.session is None:
            self._error(401, "authentication_error", "invalid x-api-key (a relay engine run key is required)")
            return
        self.session.requests += 1

    def _error(self, status: int, kind: str, message: str, code: str | None = None,
               headers: dict[str, str] | None = None) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            self.set_header(name, value)
        self.finish(anthropic_error_body(kind, message, code))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(anthropic_error_body("api_error" if status_code >= 500 else "invalid_request_error",
                                         self._reason))

    def _query(self) -> dict[str, str]:
        return {k: v[-1].decode("utf-8", "replace") for k, v in self.request.query_arguments.items() if v}

    def _client_headers(self) -> dict[str, str]:
        headers = {k.lower(): v for k, v in self.request.headers.items()}
        # the run's profile, never one the engine's subprocess (or a command it runs) names itself
        headers.pop(PROFILE_HEADER, None)
        if self.session is not None and self.session.profile is not None:
            headers[PROFILE_HEADER] = self.session.profile
        return headers

    async def _refused(self, exc: ProxyError) -> None:
        session = self.session
        if session is not None:
            session.refusals += 1
            if exc.code and session.on_refusal is not None:
                try:
                    session.on_refusal(exc.code, exc.message)
                except Exception:  # the engine's callback must not break the answer
                    log.exception("engine refusal callback failed")
        self._error(exc.status, exc.error_type, exc.message, exc.code, exc.headers())

    async def _write(self, response: Any) -> None:
        self.set_status(response.status)
        for name, value in response.headers.items():
            self.set_header(name, value)
        if response.streaming:
            self.set_header("Cache-Control", "no-cache")
        chunks = response.chunks
        try:
            async for chunk in chunks:
                self.write(chunk)
                if response.streaming:
                    await self.flush()
        except StreamClosedError:
            await chunks.aclose()  # the CLI went away: the generator settles the reservation
            return
        except ProxyError as exc:
            await chunks.aclose()
            if response.streaming:
                self.write(b"event: error\ndata: " + exc.body() + b"\n\n")
            else:
                self.clear()
                await self._refused(exc)
                return
        try:
            self.finish()
        except StreamClosedError:
            pass

    async def _messages(self, count_tokens: bool) -> None:
        assert self.session is not None
        try:
            # the run's caps go with the request: the gate narrows them to the live grant (a grant narrowed
            # mid-run binds at the next request), refuses a request past max_steps_per_run or one whose
            # reservation would pass max_tokens_per_run (BUDGET_EXCEEDED, audited, nothing forwarded), and
            # the settlement counts the tokens charged into the run, as for the built-in loop
            response = await self.endpoint.proxy.messages(self.session.origin, self.request.body, self._query(),
                                                          self._client_headers(), count_tokens=count_tokens,
                                                          run=None if count_tokens else self.session.run_budget)
        except ProxyError as exc:
            await self._refused(exc)
            return
        await self._write(response)


class _Messages(_Base):
    async def post(self) -> None:
        await self._messages(False)


class _CountTokens(_Base):
    async def post(self) -> None:
        await self._messages(True)


class _Models(_Base):
    async def get(self) -> None:
        assert self.session is not None
        try:
            response = await self.endpoint.proxy.models(self.session.origin, self._query(), self._client_headers())
        except ProxyError as exc:
            await self._refused(exc)
            return
        await self._write(response)
