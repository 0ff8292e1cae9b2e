"""The tool executor: the one pipeline of every tool call, model-proposed (:meth:`Executor.run_call`)
or client-initiated (``tools.call``, :meth:`Executor.execute_client_call`), in a fixed order:

1. argument size cap (:data:`~relay_jupyter.core.tooling.MAX_ARGUMENT_BYTES` of JSON, object root)
2. JSON Schema validation against the tool's schema (``jsonschema``; a broken schema refuses)
0. the tool as its source describes it *now* (an MCP server is re-listed): if it differs from the
   spec the run was offered, or last asked about (:func:`~relay_jupyter.runtime.tools.tool_identity`: description,
   schema, source, annotations), the call is a ``write`` whose card says the tool changed (old,
   new, diff), no pin, run allow or saved trust applies, and the run offers the new spec from its
   next step on
3. preflight (the source's local checks; card reasons and preview)
4. gate (grant, allowlist, budget, class) — and 5. consent, inside the gate, for writes
6. execute, with a journal intent record before and an outcome record after (MCP: the approved
   digest and annotations are re-checked by the registry at the call, ``DIGEST_MISMATCH``)
7. audit (the gate writes the audit record of every decision and execution)

Sources are :class:`~relay_jupyter.core.tooling.ToolSource` objects looked up in a
:class:`~relay_jupyter.runtime.tools.ToolIndex` (first source wins a name); the broker's list is
``broker/tool_sources.py``. Every path ends in a :class:`~relay_jupyter.core.tooling.ToolResult`: a refusal is a result the
model reads (``is_error`` with the refusal code), never an exception that would leave the call
unanswered. Only cancellation propagates, after the journal has recorded it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from ..backends.base import ToolCallDone
from ..core.errors import Code, GateRefusal, Refusal
from ..core.redact import redact
from ..core.tooling import MAX_ARGUMENT_BYTES, ToolContext, ToolResult, ToolSource, as_result
from ..core.types import ToolClass, ToolRequest, ToolSpec, stricter
from ..protocol.names import EventType
from .offload import off_loop, off_loop_or_undo
from .tools import ToolIndex, tool_change, tool_identity

__all__ = ["MAX_ARGUMENT_BYTES", "MAX_RESULT_CHARS", "Executor", "Emit", "refusal_of", "refused"]

#: Largest tool result kept (stored and sent); longer output is cut with a marker.
MAX_RESULT_CHARS = 512 * 1024

Emit = Callable[[str, dict[str, Any], ToolContext], None]
"""``emit(event_type, data, ctx)``: appends one event to the run's ordered channel."""



def _jsonschema() -> Any:
    """``jsonschema``, imported on first use: its import costs seconds on a loaded machine (it pulls
    ``rfc3987_syntax``, which builds a grammar), and the daemon, the CLI and broker start should not pay it."""
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators

    return jsonschema

#: Refusals that mean consent was asked (so a changed tool's card was shown).
_ASKED = (Code.CONSENT_DENIED, Code.PERMISSION_TIMEOUT)

#: The card line of a call to a tool that changed since the run was offered it.
CHANGED_REASON = ("this tool changed since the run was offered it (description, schema or annotations): "
                  "it is asked about as a write, and its pin, run allow and saved trust no longer apply")


def refused(code: Code | str, message: str, data: dict[str, Any] | None = None) -> ToolResult:
    """The result the model sees for a call that was not run. ``data`` keeps the plain message and
    the refusal's error data, so ``tools.call`` answers with the same JSON-RPC error a direct
    refusal would give (:func:`refusal_of`)."""
    code = Code(code)
    return ToolResult(f"refused ({code.value}): {message}", is_error=True, code=code.value,
                      data={"message": message, "error_data": dict(data or {})})


def refusal_of(result: ToolResult) -> Refusal | None:
    """The :class:`Refusal` a refused result stands for (None for a result that ran): how a client
    call (``tools.call``) reports a refusal — an RPC error with its code, message and data."""
    if result.code is None:
        return None
    message = result.data.get("message", result.content)
    return Refusal(result.code, message if isinstance(message, str) else result.content,
                   data=dict(result.data.get("error_data") or {}))


class _Validators:
    """Compiled validators keyed by spec digest (schemas are checked once, then reused)."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def get(self, spec: ToolSpec) -> Any:
        key = spec.digest
        validator = self._cache.get(key)
        if validator is None:
            jsonschema = _jsonschema()
            cls = jsonschema.validators.validator_for(spec.input_schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(spec.input_schema)
            validator = cls(spec.input_schema)
            if len(self._cache) > 1024:
                self._cache.clear()
            self._cache[key] = validator
        return validator


class Executor:
    """Runs calls through the fixed order. ``consent_for(ctx)`` picks the consent port of the
    run's permission mode; the gate asks it only for write-class calls."""

    def __init__(self, gate: Any, journal: Any, emit: Emit, consent_for: Callable[[ToolContext], Any],
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.gate = gate
        self.journal = journal
        self.emit = emit
        self.consent_for = consent_for
        self.clock = clock
        self._validators = _Validators()

    async def run_call(self, ctx: ToolContext, index: ToolIndex, call: ToolCallDone) -> ToolResult:
        """Take one model-proposed call through every step; always returns a result."""
        self.emit(EventType.TOOL_PROPOSED, {"call_id": call.id, "tool": call.name,
                                            "arguments": redact(call.input)}, ctx)
        found = index.get(call.name)
        if found is None:
            return self._refuse(ctx, call.id, Code.UNKNOWN_TOOL,
                                f"there is no tool named {call.name[:100]!r} in this run")
        if call.raw_size > MAX_ARGUMENT_BYTES:
            return self._refuse(ctx, call.id, Code.ARGUMENTS_TOO_LARGE,
                                f"arguments are {call.raw_size} bytes; the limit is {MAX_ARGUMENT_BYTES}")
        if call.raw is not None:
            return self._refuse(ctx, call.id, Code.INVALID_ARGUMENTS, "arguments must be a JSON object")
        return await self._checked(ctx, found, call.id, call.input, index)

    async def execute_client_call(self, ctx: ToolContext, index: ToolIndex, tool: str,
                                  arguments: Any, call_id: str) -> ToolResult:
        """A client-initiated call (``tools.call``): same steps and the same gate as a model call."""
        self.emit(EventType.TOOL_PROPOSED, {"call_id": call_id, "tool": tool,
                                            "arguments": redact(arguments)}, ctx)
        found = index.get(tool)
        if found is None:
            return self._refuse(ctx, call_id, Code.UNKNOWN_TOOL, f"there is no tool named {tool[:100]!r}")
        if not isinstance(arguments, dict):
            return self._refuse(ctx, call_id, Code.INVALID_ARGUMENTS, "arguments must be a JSON object")
        size = len(json.dumps(arguments, ensure_ascii=False).encode())
        if size > MAX_ARGUMENT_BYTES:
            return self._refuse(ctx, call_id, Code.ARGUMENTS_TOO_LARGE,
                                f"arguments are {size} bytes; the limit is {MAX_ARGUMENT_BYTES}")
        return await self._checked(ctx, found, call_id, arguments, index)

    async def _checked(self, ctx: ToolContext, found: tuple[ToolSource, ToolSpec], call_id: str,
                       args: dict[str, Any], index: ToolIndex | None = None) -> ToolResult:
        source, offered = found
        try:
            now = await source.tool_current(ctx, offered.name)
        except Refusal as exc:  # e.g. the MCP server cannot be reached to re-list it
            return self._refuse(ctx, call_id, exc.code, exc.message, exc.data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a source that cannot say what the tool is now refuses the call
            return self._refuse(ctx, call_id, Code.TOOL_ERROR,
                                f"could not re-read the tool {offered.name!r} ({type(exc).__name__})")
        if now is None:
            if index is not None:
                index.drop(offered.name)
            return self._refuse(ctx, call_id, Code.UNKNOWN_TOOL,
                                f"the tool {offered.name[:100]!r} is no longer offered by its source")
        changed: dict[str, Any] | None = None
        baseline = (index.baseline(offered.name) if index is not None else None) or offered
        if tool_identity(now) != tool_identity(baseline):
            # bound to what was classified and offered: a changed tool is a write for this call
            changed = tool_change(baseline, now)
            if index is not None:
                index.replace(offered.name, now)
            spec = now.model_copy(update={"tool_class": ToolClass.WRITE, "parallel_safe": False})
        else:
            if index is not None and tool_identity(offered) != tool_identity(now):
                index.replace(offered.name, now)  # changed and changed back before anyone saw it
            cls = stricter(baseline.tool_class, now.tool_class)  # unpinned meanwhile: stricter now
            spec = now if cls is now.tool_class else now.model_copy(update={"tool_class": cls})
        try:
            validator = self._validators.get(spec)
        except _jsonschema().exceptions.SchemaError:
            return self._refuse(ctx, call_id, Code.INVALID_ARGUMENTS,
                                f"the schema of tool {spec.name!r} is not a valid JSON Schema")
        error = _jsonschema().exceptions.best_match(validator.iter_errors(args))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            return self._refuse(ctx, call_id, Code.INVALID_ARGUMENTS,
                                f"arguments do not match the schema at {where}: {error.message[:300]}")
        self.emit(EventType.TOOL_VALIDATED, {"call_id": call_id, "tool": spec.name,
                                             "tool_class": spec.tool_class.value,
                                             **({"tool_changed": True} if changed is not None else {})}, ctx)
        try:
            pre = await source.tool_preflight(ctx, spec.name, args)
        except Refusal as exc:
            return self._refuse(ctx, call_id, exc.code, exc.message, exc.data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken source refuses its own call, never the run
            return self._refuse(ctx, call_id, Code.TOOL_ERROR, f"preflight failed ({type(exc).__name__})")
        if pre.tool_class is not None:
            # per-call class: only ever stricter than the spec's (core/types.stricter)
            cls = stricter(spec.tool_class, ToolClass(pre.tool_class))
            if cls is not spec.tool_class:
                spec = spec.model_copy(update={"tool_class": cls})
        reasons, preview = pre.reasons, pre.preview
        if changed is not None:
            reasons = (CHANGED_REASON, *reasons)
            preview = {**preview, "tool_changed": changed}
        request = ToolRequest(origin=ctx.origin, tool=spec, arguments=args, call_id=call_id,
                              run_id=ctx.run_id, conversation=ctx.conversation, originator=ctx.originator,
                              mode=ctx.mode, reasons=reasons, preview=preview)
        decision: dict[str, Any] = {}

        async def execute(*_: Any, **__: Any) -> ToolResult:
            # reached only when the gate allowed the call (consent included)
            decision["allowed"] = True
            if changed is not None and index is not None:
                index.acknowledge(spec.name, now)  # allowed as changed: later calls compare with it
            self.emit(EventType.TOOL_DECIDED, {"call_id": call_id, "decision": "allow"}, ctx)
            return await self._execute(ctx, source, spec, call_id, args, pre.preview)

        try:
            value = await self.gate.call_tool(request, execute, self.consent_for(ctx))
        except GateRefusal as exc:
            if changed is not None and index is not None and exc.code in _ASKED:
                index.acknowledge(spec.name, now)  # the person saw this change (and said no)
            return self._refuse(ctx, call_id, exc.code, exc.message, exc.data)
        except Refusal as exc:
            if decision.get("allowed"):
                return self._finished(ctx, call_id, refused(exc.code, exc.message, exc.data), 0.0)
            return self._refuse(ctx, call_id, exc.code, exc.message, exc.data)
        return as_result(value) if not isinstance(value, ToolResult) else value

    async def _execute(self, ctx: ToolContext, source: ToolSource, spec: ToolSpec, call_id: str,
                       args: dict[str, Any], preview: dict[str, Any]) -> ToolResult:
        run_id = ctx.run_id
        # journal writes on a store thread (runtime/offload.py), each awaited: the intent is durable before
        # the tool runs, the outcome before the result goes back; a cancel waits for the write in flight
        if run_id is not None:  # cancelled meanwhile: the tool never started, and its outcome says so
            await off_loop_or_undo(lambda _: self.journal.call_outcome(run_id, call_id, {
                "status": "cancelled", "started": False}), self.journal.call_intent, run_id, call_id, spec.name,
                redact(args))
        self.emit(EventType.TOOL_STARTED, {"call_id": call_id, "tool": spec.name}, ctx)
        started = self.clock()
        try:
            result = await source.tool_call(ctx, spec.name, args, preview)
            result = _capped(as_result(result))
        except asyncio.CancelledError:
            if run_id is not None:
                await off_loop(self.journal.call_outcome, run_id, call_id,
                               {"status": "cancelled", "outcome_unknown": True})
            self.emit(EventType.TOOL_FINISHED, {"call_id": call_id, "is_error": True, "summary": "cancelled",
                                                "duration_ms": (self.clock() - started) * 1000}, ctx)
            raise
        except Refusal as exc:  # e.g. a digest changed between consent and execution
            result = refused(exc.code, exc.message, exc.data)
        except Exception as exc:
            result = ToolResult(f"the tool failed: {type(exc).__name__}: {str(exc)[:500]}", is_error=True,
                                code=Code.TOOL_ERROR.value)
        if run_id is not None:
            await off_loop(self.journal.call_outcome, run_id, call_id,
                           {"status": "error" if result.is_error else "ok", "code": result.code,
                            "chars": len(result.content)})
        return self._finished(ctx, call_id, result, (self.clock() - started) * 1000)

    def _finished(self, ctx: ToolContext, call_id: str, result: ToolResult, duration_ms: float) -> ToolResult:
        self.emit(EventType.TOOL_FINISHED, {"call_id": call_id, "is_error": result.is_error,
                                            "summary": _summary(result), "duration_ms": round(duration_ms, 3),
                                            **({"code": result.code} if result.code else {})}, ctx)
        return result

    def _refuse(self, ctx: ToolContext, call_id: str, code: Code | str, message: str,
                data: dict[str, Any] | None = None) -> ToolResult:
        result = refused(code, message, data)
        self.emit(EventType.TOOL_DECIDED, {"call_id": call_id, "decision": "deny", "code": result.code,
                                           "message": message[:500]}, ctx)
        return result


def _capped(result: ToolResult) -> ToolResult:
    if len(result.content) <= MAX_RESULT_CHARS:
        return result
    cut = len(result.content) - MAX_RESULT_CHARS
    return ToolResult(result.content[:MAX_RESULT_CHARS] + f"\n[… output truncated: {cut} more characters]",
                      result.is_error, result.code, result.data)


def _summary(result: ToolResult) -> str:
    text = redact(result.content, max_str=200)
    return text if isinstance(text, str) else str(text)[:200]

