"""What relay's model endpoints share (issue 16 items 1, 2 and 8): one gate / reserve / forward / settle path,
two wire formats — the Anthropic Messages API (:mod:`.anthropic_proxy`) and OpenAI Chat Completions
(:mod:`.openai_proxy`).

For every request of either format:

1. the body is bounded (:data:`MAX_BODY_BYTES`), JSON, an object with a string ``model`` (the wire module
   checks the rest of its own shape);
2. the model must be served by the broker (``c.RelayApp.allowed_models``, else the backend's patterns);
3. the gate reserves the whole request before anything is forwarded (``Gate.begin_completion``: grant,
   the grant's model allowlist, rate, token and cost budgets; audited as tool ``model:<id>``,
   ``purpose: proxy``);
4. the request goes upstream with the broker's key; nothing of the client's request but a few named
   headers leaves the broker;
5. the answer streams back while a :class:`Meter` reads its usage; an answer that streams far past what
   was reserved (a server that ignores ``max_tokens``) is cut with a ``BUDGET_EXCEEDED`` error in the
   wire's own shape; the reservation is settled by the rules of runs (reported usage within bounds;
   absurd usage clamped; no usage an estimate — a real tokenizer count where the wire module has one;
   a cut stream or a client gone: the reservation; an upstream error answer: nothing).

Written on ``httpx2`` (the SDKs' transport) rather than through an SDK client: a proxy must forward bodies
and SSE bytes it does not model (new fields, new event types) unchanged.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.budgets import RequestEstimate, Reservation, RunBudget
from ..core.errors import Code, GateRefusal
from ..core.redact import mask_secret_text
from ..core.types import Usage
from ..runtime.offload import off_loop, off_loop_or_undo

__all__ = ["CEILING_CHARS_PER_TOKEN", "CEILING_SLACK_CHARS", "MAX_BODY_BYTES", "MAX_SSE_EVENT_BYTES", "GatedProxy",
           "Meter", "ProxyError", "ProxyResponse", "anthropic_error_body", "invalid", "openai_error_body",
           "refusal"]

log = logging.getLogger(__name__)

#: Largest request body accepted (Claude Code sends long histories; images are base64 in the body).
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Largest single SSE event read from upstream while streaming (bounded memory per stream).
MAX_SSE_EVENT_BYTES = 1024 * 1024
#: An answer is cut once it has streamed more than this many characters per reserved output token (plus
#: :data:`CEILING_SLACK_CHARS`): no tokenizer averages more than a few characters per token over an
#: answer, so only a server that ignores ``max_tokens`` gets there, and what it sends beyond the
#: reservation would be spend nobody reserved.
CEILING_CHARS_PER_TOKEN = 16
CEILING_SLACK_CHARS = 1024
#: Streamed text kept for a tokenizer count at the end (beyond it, the character estimate is used).
_MAX_KEPT_CHARS = 1 << 20
UPSTREAM_TIMEOUT = 600.0


class ProxyError(Exception):
    """A refusal or failure, answered in the wire's error shape (:meth:`body` Anthropic's,
    :meth:`openai_body` OpenAI's). ``error_type`` is the Anthropic error type; the OpenAI body maps it."""

    def __init__(self, status: int, error_type: str, message: str, *, code: str | None = None,
                 retry: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.code = code
        self.retry = retry

    def body(self) -> bytes:
        return anthropic_error_body(self.error_type, self.message, self.code)

    def openai_body(self) -> bytes:
        return openai_error_body(self.error_type, self.message, self.code)

    def headers(self) -> dict[str, str]:
        return {} if self.retry else {"x-should-retry": "false"}


def _relay_text(message: str, code: str | None) -> str:
    return f"relay: {message}" + (f" [{code}]" if code else "")


def anthropic_error_body(error_type: str, message: str, code: str | None = None) -> bytes:
    """The Messages API's error shape; the relay code (if any) ends the message and is a field too."""
    body: dict[str, Any] = {"type": "error", "error": {"type": error_type, "message": _relay_text(message, code)}}
    if code:
        body["relay_code"] = code
    return json.dumps(body).encode()


# Anthropic error type -> OpenAI error type (the OpenAI SDKs pick their exception by HTTP status; the type is
# what a program reads: a spent budget is OpenAI's own "insufficient_quota")
_OPENAI_TYPES = {"api_error": "server_error", "request_too_large": "invalid_request_error",
                 "not_found_error": "invalid_request_error", "overloaded_error": "server_error"}


def openai_error_body(error_type: str, message: str, code: str | None = None) -> bytes:
    """OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``; ``code`` is the relay code."""
    kind = "insufficient_quota" if code == Code.BUDGET_EXCEEDED.value else _OPENAI_TYPES.get(error_type, error_type)
    return json.dumps({"error": {"message": _relay_text(message, code), "type": kind, "param": None,
                                 "code": code}}).encode()


# gate refusal code -> (HTTP status, Anthropic error type, may the SDK retry)
_REFUSALS: dict[str, tuple[int, str, bool]] = {
    Code.UNAUTHORIZED.value: (403, "permission_error", False),
    Code.SCOPE_EXCEEDED.value: (403, "permission_error", False),
    Code.BUDGET_EXCEEDED.value: (429, "rate_limit_error", False),
}


def refusal(exc: GateRefusal) -> ProxyError:
    """A gate refusal as the endpoint's error."""
    status, kind, retry = _REFUSALS.get(exc.code.value, (403, "permission_error", False))
    return ProxyError(status, kind, exc.message, code=exc.code.value, retry=retry)


def invalid(message: str) -> ProxyError:
    return ProxyError(400, "invalid_request_error", message)


@dataclass
class ProxyResponse:
    """What the transport writes: a status, headers, then ``chunks`` (one whole body, or SSE bytes)."""

    status: int
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]
    streaming: bool = False


@dataclass
class Meter:
    """Usage read from an answer as it passes (SSE events or the JSON body). A wire module subclasses it
    with ``_event`` (one SSE event's ``data`` payload) and ``feed_json`` (a whole JSON answer).

    ``ceiling_chars``: the streamed characters past which the answer is cut (``BUDGET_EXCEEDED``);
    ``keep_text``: keep the streamed text (up to 1 MiB) for a tokenizer count at the end."""

    ceiling_chars: int | None = None
    keep_text: bool = False
    request: Any = None
    """The parsed request, for a wire module's count at the end."""
    tool_filter: Any = None
    """The grant's tool policy over this answer (``broker/proxy_tools.py``); None: off."""
    usage: Usage = field(default_factory=Usage)
    stopped: bool = False
    streamed_chars: int = 0
    kept: list[str] = field(default_factory=list)
    _kept_chars: int = 0
    _buf: bytearray = field(default_factory=bytearray)

    def feed_sse(self, chunk: bytes) -> bytes:
        """Meter ``chunk``; return what to send on: ``chunk`` itself without a tool filter (byte for byte, at
        once), else the complete events so far, each as it came or as the filter rewrote it (an event cut
        off by the end of the stream is never sent: SSE clients drop it too)."""
        self._buf += chunk
        out = bytearray()
        while True:
            end = _event_end(self._buf)
            if end is None:
                if len(self._buf) > MAX_SSE_EVENT_BYTES:
                    raise ProxyError(502, "api_error", "the model server sent an SSE event over "
                                     f"{MAX_SSE_EVENT_BYTES} bytes", code=Code.BACKEND_ERROR.value)
                break
            whole, self._buf = bytes(self._buf[:end[1]]), self._buf[end[1]:]
            raw = whole[:end[0]]
            data = b"\n".join(line[5:].lstrip(b" ") for line in raw.replace(b"\r\n", b"\n").split(b"\n")
                              if line.startswith(b"data:"))
            replaced = None
            if data:
                self._event(data)
                if self.tool_filter is not None:
                    replaced = self._filtered(data)
            if self.tool_filter is not None:
                out += whole if replaced is None else replaced
        return chunk if self.tool_filter is None else bytes(out)

    def _filtered(self, data: bytes) -> bytes | None:
        try:
            event = json.loads(data)
        except ValueError:
            return None
        if not isinstance(event, dict):
            return None
        events = self.tool_filter.event(event)
        return None if events is None else b"".join(self._encode(e) for e in events)

    def _encode(self, event: dict[str, Any]) -> bytes:  # pragma: no cover - every wire module overrides it
        raise NotImplementedError

    def filter_json(self, body: bytes) -> bytes:
        """The JSON answer to send on: as it came, or with refused tool calls replaced."""
        if self.tool_filter is None:
            return body
        try:
            answer = json.loads(body)
        except ValueError:
            return body
        changed = self.tool_filter.message(answer) if isinstance(answer, dict) else None
        return body if changed is None else json.dumps(changed).encode()

    def _event(self, data: bytes) -> None:  # pragma: no cover - every wire module overrides it
        raise NotImplementedError

    def feed_json(self, body: bytes) -> None:  # pragma: no cover - every wire module overrides it
        raise NotImplementedError

    def text(self, value: str) -> None:
        """Count streamed answer text (and tool arguments); cut the answer past the ceiling."""
        self.streamed_chars += len(value)
        if self.keep_text and self._kept_chars < _MAX_KEPT_CHARS:
            self.kept.append(value)
            self._kept_chars += len(value)
        if self.ceiling_chars is not None and self.streamed_chars > self.ceiling_chars:
            raise ProxyError(429, "rate_limit_error", "the answer went far past the output this request reserved "
                             "(the model server ignores max_tokens): relay ended it",
                             code=Code.BUDGET_EXCEEDED.value, retry=False)

    @property
    def kept_text(self) -> str | None:
        """The whole streamed text, or None when it was not kept (or was too long to keep)."""
        if not self.keep_text or self._kept_chars >= _MAX_KEPT_CHARS:
            return None
        return "".join(self.kept)

    def merge(self, usage: Any) -> None:
        """Merge usage in relay's field names; cumulative: a field left out keeps its earlier value."""
        if not isinstance(usage, Mapping):
            return
        values = self.usage.model_dump()
        for name in values:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                values[name] = value
        self.usage = Usage.model_construct(**values)


def _event_end(buf: bytearray) -> tuple[int, int] | None:
    """(end of the first event, start of the next) in ``buf``, or None when no event is complete."""
    best: tuple[int, int] | None = None
    for sep in (b"\n\n", b"\r\n\r\n"):
        i = buf.find(sep)
        if i != -1 and (best is None or i < best[0]):
            best = (i, i + len(sep))
    return best


def json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def ceiling_for(max_output: int) -> int:
    return CEILING_CHARS_PER_TOKEN * max_output + CEILING_SLACK_CHARS


class GatedProxy:
    """The shared path for one broker and one wire format. A wire module provides the upstream
    (:meth:`_resolve_upstream`), its headers (:meth:`_headers`), the models it serves (:meth:`_served`) and
    its :class:`Meter`; it may count an unreported answer with a real tokenizer (:meth:`_unreported`)."""

    #: response headers passed back to the client
    returned_headers: tuple[str, ...] = ("content-type", "retry-after")
    #: what the answers of this wire call the model server in messages
    upstream_name = "the model server"

    def __init__(self, broker: Any, *, client_factory: Callable[[], Any] | None = None) -> None:
        self.broker = broker
        self._client_factory = client_factory
        self._client: Any = None
        self._upstream: tuple[str, Any] | None = None
        self._profile_upstreams: dict[str, tuple[str, Any]] = {}
        self._parsed_profiles: dict[str, Any] | None = None

    # -- hooks -----------------------------------------------------------------------------------
    def _resolve_upstream(self) -> tuple[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    #: ``anthropic`` | ``openai``: which URL and key of a profile this wire uses
    wire = ""

    def _base_url(self, url: str) -> str:
        """A configured base URL as the wire module joins paths to it."""
        return url.rstrip("/")

    # -- profiles (broker/profiles.py) ---------------------------------------------------------------
    def _profiles(self) -> dict[str, Any]:
        if self._parsed_profiles is None:
            from ..mcp.policy import parse_insecure_endpoints
            from .profiles import parse_profiles

            config = self.broker.config
            self._parsed_profiles = parse_profiles(getattr(config, "profiles", {}) or {},
                                                   parse_insecure_endpoints(config.allow_insecure_endpoints))
        return self._parsed_profiles

    def _profile(self, origin: str, client_headers: Mapping[str, str]) -> str | None:
        """The profile the request picks (``X-Relay-Profile``), once the origin's grant allows it; None: the
        broker's own upstream. A refusal is audited (tool ``profile:<name>``)."""
        from .profiles import PROFILE_HEADER

        name = client_headers.get(PROFILE_HEADER, "").strip()
        if not name:
            return None
        profiles = self._profiles()
        if name not in profiles:
            raise ProxyError(404, "not_found_error", f"no profile named {name[:40]!r} is configured on this broker "
                             "(c.RelayApp.profiles)", code=Code.NOT_FOUND.value, retry=False)
        grant = self.broker.gate.grants.get(origin)
        allowed = getattr(grant, "profiles", frozenset())
        if grant is None or ("*" not in allowed and name not in allowed):
            from ..core.types import AuditRecord

            code = Code.UNAUTHORIZED if grant is None else Code.SCOPE_EXCEEDED
            self.broker.audit.append(AuditRecord(ts=time.time(), origin=origin, tool=f"profile:{name}",
                                                 decision="deny", code=code.value,
                                                 arguments={"purpose": "proxy", "wire": self.wire}))
            raise refusal(GateRefusal(code, f"{origin} has no grant: connect this notebook to relay first"
                                      if grant is None else f"the profile {name!r} is not in this notebook's grant"))
        if profiles[name].url(self.wire) is None:
            raise ProxyError(400, "invalid_request_error", f"the profile {name!r} has no {self.wire}_base_url")
        return name

    def _upstream_for(self, profile: str | None) -> tuple[str, Any]:
        """(base URL, key or None) of the broker's own upstream, or of ``profile`` (its key from the secrets
        file only: never the configuration, never the server's environment)."""
        if profile is None:
            return self._resolve_upstream()
        cached = self._profile_upstreams.get(profile)
        if cached is None:
            from ..backends.keys import KeySource

            spec = self._profiles()[profile]
            entry = spec.key_entry(profile, self.wire)
            key = KeySource({}, self.broker.config.secrets_file, env={}).get(entry)
            if key is None and self.wire == "anthropic":
                raise ProxyError(503, "api_error", f"the profile {profile!r} has no key: put it in the relay secrets "
                                 f"file (mode 0600) as {entry!r}", code=Code.NO_CREDENTIALS.value, retry=False)
            cached = self._profile_upstreams[profile] = (self._base_url(spec.url(self.wire)), key)
        return cached

    def _headers(self, key: Any, client_headers: Mapping[str, str]) -> dict[str, str]:  # pragma: no cover
        raise NotImplementedError

    def _served(self, model: str) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _unreported(self, reservation: Reservation | None, meter: Meter) -> int:
        """For a complete answer that reported no usage: the estimate of its output (characters / 3:
        conservative). A wire module with a real tokenizer counts instead, and may tighten
        ``reservation.estimate`` (the input bound the estimate charges) to its count of the request."""
        return meter.streamed_chars // 3

    # -- the HTTP client ---------------------------------------------------------------------------
    def _http(self) -> Any:
        if self._client is None:
            if self._client_factory is not None:
                self._client = self._client_factory()
            else:
                import httpx2

                self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(UPSTREAM_TIMEOUT, connect=10.0),
                                                  follow_redirects=False, trust_env=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- the gate ------------------------------------------------------------------------------------
    def _parse(self, body: bytes) -> dict[str, Any]:
        if len(body) > MAX_BODY_BYTES:
            raise ProxyError(413, "request_too_large", f"the request body is over {MAX_BODY_BYTES} bytes")
        try:
            message = json.loads(body)
        except ValueError:
            raise invalid("the request body is not valid JSON") from None
        if not isinstance(message, dict):
            raise invalid("the request body must be a JSON object")
        model = message.get("model")
        if not isinstance(model, str) or not model or len(model) > 256:
            raise invalid("model: a model id (string) is required")
        return message

    def _check_model(self, origin: str, model: str) -> None:
        if not self._served(model):
            raise ProxyError(403, "permission_error", f"the model {model!r} is not served by this broker",
                             code=Code.SCOPE_EXCEEDED.value, retry=False)

    def _grant(self, origin: str) -> Any:
        """The origin's live grant, after taking one request of its rate limit (listing models and
        counting tokens spend the broker's upstream rate limit too)."""
        gate = self.broker.gate
        grant = gate.grants.get(origin)
        if grant is None:
            raise refusal(GateRefusal(Code.UNAUTHORIZED, f"{origin} has no grant: connect this notebook to "
                                      "relay first"))
        try:
            gate.ledger.take_request(origin, grant)
        except GateRefusal as exc:
            raise refusal(exc) from None
        return grant

    def _tool_policy(self, origin: str, model: str) -> Any:
        """The grant's tool policy for this answer (``broker/proxy_tools.ToolPolicy``), or None when the grant
        sets none (the default: answers pass unchanged). Each refusal is audited."""
        grant = self.broker.gate.grants.get(origin)
        allowed = getattr(grant, "proxy_tools", None)
        if allowed is None:
            return None
        from ..core.types import AuditRecord
        from .proxy_tools import ToolPolicy

        def refused(name: str, call_id: str | None) -> None:
            try:
                self.broker.audit.append(AuditRecord(
                    ts=time.time(), origin=origin, tool=name, decision="deny", code=Code.SCOPE_EXCEEDED.value,
                    call_id=call_id[:200] if call_id else None,
                    arguments={"purpose": "proxy_tool", "model": model}))
            except Exception:  # noqa: BLE001 - the refusal stands even when the audit cannot be written
                log.exception("relay proxy: auditing a refused tool call failed")

        return ToolPolicy(frozenset(allowed), refused)

    async def _reserve(self, origin: str, model: str, estimate: RequestEstimate, profile: str | None = None, *,
                       run: RunBudget | None = None, asked_output: int | None = None) -> Reservation:
        """``run``: the caps of the one run this request belongs to (an engine's run, broker/engine_endpoint.py):
        the gate checks its step and token caps with the reservation, as for the built-in loop. ``asked_output``:
        the client's own ``max_tokens`` when relay lowered it to fit the budgets (audited).

        On a store thread (runtime/offload.py): a budget row another broker holds locked stalls this request,
        not the broker; a request cancelled meanwhile releases the hold it got (never sent)."""
        purpose = "proxy" if profile is None else f"proxy:{profile}"  # the audit names the profile used
        try:
            return await off_loop_or_undo(lambda r: r.release(), self.broker.gate.begin_completion, origin, model,
                                          estimate=estimate, purpose=purpose, run=run, asked_output=asked_output)
        except GateRefusal as exc:
            raise refusal(exc) from None

    # -- forwarding --------------------------------------------------------------------------------------
    def _returned(self, headers: Mapping[str, str]) -> dict[str, str]:
        return {name: headers[name] for name in self.returned_headers if name in headers}

    @staticmethod
    def _masked(body: bytes, key: Any) -> bytes:
        text = body.decode("utf-8", "replace")
        if key is not None:
            text = text.replace(key.reveal(), "<masked>")
        return mask_secret_text(text).encode()

    def _unreachable(self, exc: Exception) -> ProxyError:
        import httpx2

        if isinstance(exc, httpx2.TimeoutException):
            return ProxyError(504, "api_error", f"{self.upstream_name} did not answer in time",
                              code=Code.BACKEND_TIMEOUT.value)
        return ProxyError(502, "api_error", f"{self.upstream_name} could not be reached ({type(exc).__name__})",
                          code=Code.BACKEND_UNREACHABLE.value)

    async def _get_models(self, url: str, params: Mapping[str, str], headers: Mapping[str, str], key: Any,
                          grant: Any) -> ProxyResponse:
        """``GET`` a model list (``{"data": [{"id": ...}]}``, both wires), filtered to what the grant and
        the broker allow."""
        import httpx2

        try:
            resp = await self._http().get(url, params=dict(params), headers=_plain(headers))
        except httpx2.HTTPError as exc:
            raise self._unreachable(exc) from None
        body = resp.content
        if resp.status_code == 200:
            try:
                listing = json.loads(body)
                listing["data"] = [m for m in listing.get("data", []) if isinstance(m, dict)
                                   and isinstance(m.get("id"), str) and grant.allows_model(m["id"])
                                   and self._served(m["id"])]
                body = json.dumps(listing).encode()
            except (ValueError, AttributeError, TypeError):
                raise ProxyError(502, "api_error", f"{self.upstream_name} sent a malformed model list",
                                 code=Code.BACKEND_ERROR.value) from None
        return ProxyResponse(resp.status_code, self._returned(resp.headers), once(self._masked(body, key)))

    async def _forward(self, url: str, body: bytes, params: Mapping[str, str], headers: Mapping[str, str],
                       key: Any, reservation: Reservation | None, model: str | None, meter: Meter | None,
                       *, observed: Any = None, profile: str | None = None,
                       run: RunBudget | None = None) -> ProxyResponse:
        """POST ``body`` upstream and answer with what comes back; ``meter`` None: forwarded unmetered
        (``count_tokens``). A metered request leaves a telemetry row (:meth:`_record`); ``observed`` is its
        session and lineage (``broker/sessions.Observation``), committed only when the answer completed."""
        import httpx2

        client = self._http()
        request = client.build_request("POST", url, params=dict(params), content=body, headers=_plain(headers))
        started = time.monotonic()
        try:
            resp = await client.send(request, stream=True)
        except httpx2.HTTPError as exc:
            await self._settle(reservation, model, None, "not_started", 0, run)
            failure = self._unreachable(exc)
            self._record(reservation, model, "error", started, None, observed, failure.code, profile)
            raise failure from None
        returned = self._returned(resp.headers)
        if resp.status_code != 200:
            try:
                raw = await resp.aread()
            finally:
                await resp.aclose()
            await self._settle(reservation, model, None, "refused", 0, run)
            self._record(reservation, model, "upstream_error", started, None, observed,
                         f"HTTP_{resp.status_code}" if 100 <= resp.status_code < 1000 else None, profile)
            return ProxyResponse(resp.status_code, returned, once(self._masked(raw[:MAX_BODY_BYTES], key)))
        sse = "text/event-stream" in resp.headers.get("content-type", "")
        used = meter

        async def chunks() -> AsyncIterator[bytes]:
            outcome = "interrupted"
            streamed = 0
            collected = bytearray()
            first_at: float | None = None
            code: str | None = None
            try:
                async for chunk in resp.aiter_bytes():  # decoded, should a server compress despite identity
                    if first_at is None:
                        first_at = time.monotonic()
                    if sse:
                        out = used.feed_sse(chunk) if used is not None else chunk
                        if out:
                            yield out
                    else:
                        collected += chunk
                        if len(collected) > MAX_BODY_BYTES:
                            raise ProxyError(502, "api_error", f"{self.upstream_name}'s answer is too large",
                                             code=Code.BACKEND_ERROR.value)
                if not sse:
                    whole = bytes(collected)
                    if used is not None:
                        used.feed_json(whole)
                        whole = used.filter_json(whole)
                    yield whole
                if used is not None and used.stopped:
                    if not used.usage.total:
                        streamed = await self._unreported(reservation, used)
                    outcome = "complete"
            except ProxyError as exc:
                code = exc.code
                raise
            finally:
                await resp.aclose()
                if used is not None:
                    await self._settle(reservation, model, used.usage, outcome,
                                       streamed or used.streamed_chars // 3, run)
                    self._record(reservation, model, "ok" if outcome == "complete" else "interrupted", started,
                                 first_at, observed, code, profile)
                log.debug("relay proxy: %s %s in %.3f s (%s)", model, outcome, time.monotonic() - started,
                          "stream" if sse else "json")

        return ProxyResponse(200, returned, chunks(), streaming=sse)

    async def _settle(self, reservation: Reservation | None, model: str | None, usage: Usage | None, outcome: str,
                      streamed: int, run: RunBudget | None = None) -> None:
        """Charge the request on a store thread (runtime/offload.py), waited for even by a cancelled caller."""
        if reservation is None or model is None:
            return
        try:
            await off_loop(self.broker.gate.settle_completion, reservation, model,
                           usage if usage and usage.total else None, outcome=outcome, streamed_output_tokens=streamed,
                           run=run)
        except Exception:  # noqa: BLE001 - settling must never break the answer; the ledger keeps the hold
            log.exception("relay proxy: settling a request failed")

    def _record(self, reservation: Reservation | None, model: str | None, status: str, started: float,
                first_at: float | None, observed: Any, code: str | None, profile: str | None = None) -> None:
        """The request's telemetry row (core/telemetry.py: the gate's charge, latency, time to first
        byte, session and lineage); on success the session's new history is stored. Never raises."""
        if reservation is None or model is None:
            return
        try:
            from ..core.telemetry import safe_session_id

            now = time.monotonic()
            if status == "ok" and observed is not None:
                observed.commit()  # the lineage is stored only after the upstream request succeeded
            telemetry = getattr(self.broker, "telemetry", None)
            if telemetry is not None:
                telemetry.record_settled(
                    reservation, model=model, source="proxy", status=status,  # type: ignore[arg-type]
                    latency_ms=(now - started) * 1000.0,
                    ttft_ms=None if first_at is None else (first_at - started) * 1000.0,
                    session=getattr(observed, "session", None),
                    lineage=getattr(getattr(observed, "lineage", None), "kind", None), error_code=code,
                    profile=profile if profile and safe_session_id(profile) else None)
        except Exception:  # noqa: BLE001 - telemetry must never break the answer
            log.exception("relay proxy: recording telemetry failed")


def _plain(headers: Mapping[str, str]) -> dict[str, str]:
    """Ask for an uncompressed answer: its bytes are metered as they pass and go back without a
    ``content-encoding`` header."""
    return {**headers, "accept-encoding": "identity"}


async def once(body: bytes) -> AsyncIterator[bytes]:
    yield body
