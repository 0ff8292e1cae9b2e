"""Kernel tools: the broker asks the *originating* kernel to run a tool and waits for its answer.

The broker emits ``kernel.tool_request`` (visible only to that origin) naming the kernel client
that must answer; that kernel calls ``kernel.tool_result``. An answer from any other client is
refused with ``NOT_ORIGINATOR``; a second answer with ``CONFLICT``; no answer within the timeout
becomes an error *result* (a tool failure, reported to the model), never a hang.

Classes: ``list_variables`` and ``describe_dataframe`` only read the kernel's namespace (READ);
``propose_cell`` and ``run_code`` change what the user's kernel does (WRITE, always consent:
code run in the kernel is the user, docs/security.md). ``run_code`` is marked ``runs_code``: its card
offers only "once", and no run-scoped allow or saved trust ever applies to it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..core.caller import Caller
from ..core.errors import Code, RoutingRefusal
from ..core.tooling import Preflight, ToolContext, ToolResult, as_result, offers_kernel_tools
from ..core.types import ToolClass, ToolSpec
from ..protocol.kernel_tools import KERNEL_TOOLS
from ..protocol.names import EventType
from .events import EventBus

__all__ = ["KERNEL_TOOL_SPECS", "MAX_RESULT_CHARS", "KernelBridge", "end_kernel"]

#: Longest kernel-tool result kept (characters); longer content is cut with a marker.
MAX_RESULT_CHARS = 200_000

#: The kernel tools as the broker offers and gates them, made from the one list both processes share
#: (``protocol/kernel_tools.py``).
KERNEL_TOOL_SPECS: tuple[ToolSpec, ...] = tuple(
    ToolSpec(name=t.name, description=t.description, input_schema=t.input_schema,
             tool_class=ToolClass(t.tool_class), parallel_safe=t.parallel_safe, runs_code=t.runs_code)
    for t in KERNEL_TOOLS)
_BY_NAME = {s.name: s for s in KERNEL_TOOL_SPECS}
#: Kernel tools that act on the cell the run's ``%%agent`` runs in (its execute reply's payload).
_NEEDS_A_CELL = frozenset({"propose_cell"})


@dataclass
class _Waiting:
    origin: str
    client_id: str
    future: asyncio.Future[dict[str, Any]]


class KernelBridge:
    """Send kernel-tool requests to the originating kernel and route its answers back."""

    def __init__(self, events: EventBus, *, timeout: float = 60.0) -> None:
        if not timeout > 0:
            raise ValueError("kernel tool timeout must be positive and finite")
        self.events = events
        self.timeout = timeout
        self._waiting: dict[str, _Waiting] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()

    def specs(self) -> list[ToolSpec]:
        """The kernel tools, with their safety classes."""
        return list(KERNEL_TOOL_SPECS)

    def spec(self, name: str) -> ToolSpec | None:
        return _BY_NAME.get(name)

    # -- ToolSource (core/tooling.py) ------------------------------------------------------

    def tool_specs(self, ctx: ToolContext) -> list[ToolSpec]:
        """The kernel tools, only when a kernel is the caller (they run in that kernel:
        :func:`~relay_jupyter.core.tooling.offers_kernel_tools`). An outside gateway client (``ctx.kernel``)
        gets no ``propose_cell``: with no cell of its running there is nothing to insert a cell below."""
        if not offers_kernel_tools(ctx):
            return []
        return [s for s in KERNEL_TOOL_SPECS if s.name not in _NEEDS_A_CELL] if ctx.kernel else list(KERNEL_TOOL_SPECS)

    async def tool_current(self, ctx: ToolContext, name: str) -> ToolSpec | None:
        """Built-in tools do not change while the broker runs."""
        if not offers_kernel_tools(ctx) or (ctx.kernel and name in _NEEDS_A_CELL):
            return None
        return _BY_NAME.get(name)

    async def tool_preflight(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Preflight:
        """Kernel tools have no local check beyond the schema (the card shows the exact code)."""
        return Preflight()

    async def tool_call(self, ctx: ToolContext, name: str, args: dict[str, Any],
                        approved_preview: dict[str, Any]) -> ToolResult:
        """Ask the originating kernel (``ctx.originator`` of ``ctx.origin``) to run the tool — or, for an outside
        MCP client (``ctx.kernel``: broker/mcp_gateway.py), the origin's one live kernel, by a live-only request."""
        if ctx.kernel:
            return as_result(await self.call(ctx.origin, ctx.kernel, name, args, run_id=ctx.run_id, live_only=True))
        return as_result(await self.call(ctx.origin, ctx.originator or "", name, args, run_id=ctx.run_id))

    async def call(self, origin: str, client_id: str, tool: str, arguments: dict[str, Any], *,
                   run_id: str | None = None, timeout: float | None = None, live_only: bool = False
                   ) -> dict[str, Any]:
        """Ask kernel ``client_id`` (of ``origin``) to run ``tool``; return ``{content, is_error}``.

        ``live_only`` (an outside gateway client's call, no run): the request goes only to the event streams
        live now (never stored, so never replayed to a kernel that connects later), and only while
        ``client_id`` is the one kernel whose stream is live for ``origin`` — checked with no await before
        the delivery, so no other kernel of that notebook can receive (and run) it.

        Raises:
            RoutingRefusal: UNKNOWN_TOOL for a name that is not a kernel tool.
        """
        if self.spec(tool) is None:
            raise RoutingRefusal(Code.UNKNOWN_TOOL, f"{tool!r} is not a kernel tool")
        if live_only and self.events.kernel_clients(origin) != {client_id}:
            return {"content": f"{tool} needs the notebook's kernel: it is no longer the one kernel attached to "
                               f"{origin} (run %load_ext relay_jupyter in it)", "is_error": True}
        request_id = f"kt_{secrets.token_hex(8)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = _Waiting(origin, client_id, future)
        try:
            data = {"request_id": request_id, "run_id": run_id, "tool": tool, "arguments": arguments,
                    "client_id": client_id}
            if live_only:
                self.events.publish_unstored(EventType.KERNEL_TOOL_REQUEST, data, origin, run_id)
            else:
                self.events.append(EventType.KERNEL_TOOL_REQUEST, data, origin=origin, run_id=run_id)
            limit = self.timeout if timeout is None else timeout
            try:
                async with asyncio.timeout(limit):
                    return await asyncio.shield(future)
            except TimeoutError:
                if future.done():
                    return future.result()
                return {"content": f"the kernel did not answer {tool} within {limit:g} s", "is_error": True}
        finally:
            self._waiting.pop(request_id, None)
            self._ended[request_id] = None
            while len(self._ended) > 10_000:
                self._ended.popitem(last=False)

    def deliver(self, caller: Caller, request_id: str, content: Any, is_error: bool) -> None:
        """Hand a kernel's answer to the waiting call.

        Raises:
            RoutingRefusal: NOT_FOUND, CONFLICT (already answered or timed out), NOT_ORIGINATOR.
        """
        waiting = self._waiting.get(request_id)
        if waiting is None:
            if request_id in self._ended:
                raise RoutingRefusal(Code.CONFLICT, f"kernel tool request {request_id} has already ended")
            raise RoutingRefusal(Code.NOT_FOUND, f"no kernel tool request {request_id}")
        if caller.client_id != waiting.client_id or caller.origin != waiting.origin:
            raise RoutingRefusal(Code.NOT_ORIGINATOR, "only the kernel that was asked can answer this tool request")
        if waiting.future.done():
            raise RoutingRefusal(Code.CONFLICT, f"kernel tool request {request_id} has already been answered")
        if isinstance(content, str) and len(content) > MAX_RESULT_CHARS:
            content = content[:MAX_RESULT_CHARS] + f"\n[... cut at {MAX_RESULT_CHARS} characters]"
        waiting.future.set_result({"content": content, "is_error": bool(is_error)})

    def abandon(self, client_id: str, reason: str) -> int:
        """Answer every kernel-tool request sent to ``client_id`` with an error result at once (its
        kernel is gone: no answer can come). Returns how many."""
        count = 0
        for waiting in list(self._waiting.values()):
            if waiting.client_id == client_id and not waiting.future.done():
                waiting.future.set_result({"content": f"the kernel {reason} before it answered", "is_error": True})
                count += 1
        return count

    @property
    def waiting(self) -> int:
        return len(self._waiting)


def end_kernel(broker: Any, client_id: str, reason: str) -> dict[str, Any]:
    """A kernel restarted, shut down or died (issue 12, "Kernel lifetime"): at once, withdraw its
    pending permission requests (``permission.resolved`` ``withdrawn``; any later answer gets
    ``CONFLICT``), cancel the runs it started (each ends ``run.cancelled``, which frees the
    conversation for the notebook's next ``%%agent``), and fail its open kernel-tool requests.
    Synchronous, so nothing can approve a withdrawn request in between. Idempotent."""
    withdrawn = broker.permissions.withdraw(originator=client_id, reason=reason)
    elicitations = getattr(broker, "elicitations", None)  # its MCP servers' open questions: declined
    if elicitations is not None:
        elicitations.withdraw(originator=client_id, reason=reason)
    cancelled: list[str] = []
    runs = getattr(broker, "runs", None)
    if runs is not None:
        for summary in runs.active_runs():
            if summary.get("originator") == client_id and runs.cancel(summary["run_id"]):
                cancelled.append(summary["run_id"])
    abandoned = broker.kernel_bridge.abandon(client_id, reason)
    return {"withdrawn": withdrawn, "cancelled_runs": cancelled, "kernel_tools": abandoned}
