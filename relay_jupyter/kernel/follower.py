"""Following one run's events in a cell: text, consent, kernel tools, steps, the terminal event."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import TYPE_CHECKING, Any, cast

from ..protocol import kernel_wire as wire
from ..protocol.names import TERMINAL_EVENTS, EventType, Method
from .client import RelayClient
from .consent import Answer, ask
from ..core.errors import Code
from .errors import AgentError, RpcError, message_for
from .provenance import METADATA_KEY, ProvenanceRecorder, footer_suffix
from .render import INDICATOR, StreamView
from .rendering import chrome_html, esc, visible

if TYPE_CHECKING:
    from .session import Session

__all__ = ["RunFollower", "Ticker"]


class Ticker:
    """Wakes the kernel's loop twice a second while a cell follows a run.

    ipykernel turns an interrupt (SIGINT) of an awaiting cell into a callback that only runs at the
    loop's next iteration; with no event arriving (a slow model, a card nobody clicked) that could be
    minutes away, so "Interrupt kernel" would seem to do nothing.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float = 0.5) -> None:
        self.loop = loop
        self.every = every
        self.handle: asyncio.TimerHandle | None = loop.call_later(every, self._tick)

    def _tick(self) -> None:
        if self.handle is not None:
            self.handle = self.loop.call_later(self.every, self._tick)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class RunFollower:
    """Follows one run's events until its terminal event."""

    def __init__(self, session: Session, client: RelayClient, run_id: str, view: StreamView, surface: str,
                 recorder: ProvenanceRecorder | None = None) -> None:
        self.session = session
        self.recorder = recorder or ProvenanceRecorder(run_id)
        self.client = client
        self.run_id = run_id
        self.view = view
        self.surface = surface
        self.started = time.monotonic()
        self.tokens = 0
        self.cost = 0.0
        self.timeouts: dict[str, str] = {}     # call or request id -> tool name, each timed-out consent once
        self.cards: dict[str, list[Any]] = {}  # call id -> the consent cards shown for it
        self.request_calls: dict[str, str] = {}  # permission request id -> its call id
        self.mode: str | None = None
        self.steps: dict[str, dict[str, Any]] = {}
        self.seen_requests: set[str] = set()   # a reconnect replays pending requests: handle each once
        self.backlog: collections.deque[dict[str, Any]] = collections.deque()
        self.queue: asyncio.Queue[dict[str, Any]] | None = None

    async def follow(self, queue: asyncio.Queue[dict[str, Any]]) -> str:
        self.queue = queue
        self.view.resume()
        while True:
            event = self.backlog.popleft() if self.backlog else await queue.get()
            kind = event.get("type")
            data = event.get("data") or {}
            request_id = str(data.get("request_id", ""))
            if kind in (EventType.PERMISSION_REQUEST, EventType.KERNEL_TOOL_REQUEST, EventType.ELICITATION_REQUEST):
                if request_id in self.seen_requests:
                    continue
                self.seen_requests.add(request_id)
            self.recorder.feed(kind, data)
            if kind == EventType.TEXT_DELTA:
                self.view.text(str(data.get("text", "")))
            elif kind == EventType.RUN_STARTED:
                self._started(data)
            elif kind == EventType.PERMISSION_REQUEST:
                await self._permission(data)
            elif kind == EventType.KERNEL_TOOL_REQUEST:
                await self._kernel_tool(data)
            elif kind == EventType.ELICITATION_REQUEST:
                await self._elicitation(data)
            elif kind == EventType.ELICITATION_RESOLVED and data.get("refused"):
                self._elicitation_refused(data)
            elif kind in (EventType.TOOL_PROPOSED, EventType.TOOL_DECIDED, EventType.TOOL_FINISHED):
                self._step(kind, data)
            elif kind == EventType.PERMISSION_TIMEOUT or (
                    kind == EventType.PERMISSION_RESOLVED and data.get("decision") == "timeout"):
                # after our own answer lost the race with the broker's deadline: the broker's word stands
                self._timed_out(str(data.get("call_id") or self.request_calls.get(request_id) or request_id),
                                data.get("tool"))
            elif kind == EventType.USAGE:
                self.tokens += sum(int(data.get(k) or 0) for k in (
                    "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
                self.cost += float(data.get("cost_usd") or 0.0)
            elif kind in TERMINAL_EVENTS or kind == "_lost":
                await self._provenance(kind, data)
                return self._end(kind, data)

    async def _provenance(self, kind: str | None, data: dict[str, Any]) -> dict[str, Any]:
        """The run's provenance record (docs/provenance.md), with the checkpoints of what it pushed."""
        record = self.recorder.finish(kind, data)
        if self.recorder.pushed():
            with contextlib.suppress(AgentError):  # a broker without the workspace: no checkpoint ids
                listed = cast(wire.CheckpointsListResult,
                              await self.client.call(Method.CHECKPOINTS_LIST, {"limit": 50}, timeout=5.0))
                record["checkpoints"] = [str(c.get("id")) for c in (listed or {}).get("checkpoints", [])
                                         if isinstance(c, dict) and c.get("run_id") == self.run_id][:50]
        self.session.provenance.append(record)
        del self.session.provenance[:-1000]  # bounded: the notebook file keeps the rest
        return record


    def _footer(self, mark: str) -> str:
        cost = f" · ${self.cost:.4f}" if self.cost else ""
        return (f"{mark} · {time.monotonic() - self.started:.1f} s · {self.tokens:,} tokens{cost}"
                f"{footer_suffix(self.recorder.record)} · run `{self.run_id}`")

    def _end(self, kind: str | None, data: dict[str, Any]) -> str:
        # the footer's output carries the answer's provenance (saved with the notebook: docs/provenance.md)
        meta = {METADATA_KEY: {"provenance": self.recorder.record}}
        if kind == EventType.DONE:
            answer = self.view.finish(self._footer("✓ *done*"), metadata=meta)
            self._raise_timeouts()
            return answer
        self.view.finish(self._footer(f"✗ *{str(kind).removeprefix('run.')}*"), metadata=meta)
        if kind == EventType.ERROR:
            self._raise_timeouts()  # the timeout is why the run failed: say that, not what followed
        if kind == EventType.BUDGET_EXHAUSTED:
            raise AgentError(message_for("BUDGET_EXCEEDED", str(data.get("message") or "budget exhausted")),
                             code=Code.BUDGET_EXCEEDED)
        if kind == EventType.CANCELLED:
            raise AgentError("the run was cancelled", code=Code.CANCELLED)
        if kind == EventType.INTERRUPTED:
            raise AgentError("the run was interrupted (the broker restarted); re-run the cell", code=Code.INTERRUPTED)
        if kind == "_lost":
            raise AgentError(str(data.get("message") or "lost the broker's event stream"))
        code = data.get("code") if isinstance(data.get("code"), str) else None
        raise AgentError(message_for(code, str(data.get("message") or "the run failed")), code=code)

    def _step(self, kind: str, data: dict[str, Any]) -> None:
        """A tool call shown as one small line, updated as it is decided and finished."""
        call_id = str(data.get("call_id", ""))
        step = self.steps.setdefault(call_id, {"tool": data.get("tool", "?"), "display": None})
        if kind == EventType.TOOL_DECIDED:
            step["decision"] = data.get("decision")
            step["code"] = data.get("code")
        if kind == EventType.TOOL_FINISHED:
            step["ms"] = data.get("duration_ms")
            step["error"] = data.get("is_error")
        if kind == EventType.TOOL_DECIDED and data.get("code") == "PERMISSION_TIMEOUT":
            # the gate's own verdict: whatever the router said about the card, nobody answered in time
            self._timed_out(call_id, step["tool"])
        if self.surface == "input":
            return
        name = str(step["tool"])[:120]
        state = str(step.get("decision") or "proposed")
        if step.get("code"):
            state += f" ({str(step['code'])[:60]})"
        if "ms" in step:
            state += f" · {'failed' if step.get('error') else 'done'} in {float(step['ms'] or 0):.0f} ms"
        # the tool name is free text from a server or the model: escaped (newlines and backticks shown)
        line = {"text/html": chrome_html(f"▸ <code>{esc(name, newlines=False)}</code> — {esc(state)}"),
                "text/plain": f"▸ {visible(name, newlines=False)} — {visible(state)}"}
        from IPython.display import display, update_display

        if step["display"] is None:
            self.view.pause()
            step["display"] = f"relay-step-{self.run_id}-{call_id}"
            display(line, raw=True, display_id=step["display"])
            self.view.resume()
        else:
            update_display(line, raw=True, display_id=step["display"])

    def _started(self, data: dict[str, Any]) -> None:
        """``run.started``: in ``full`` mode, say at the top of the cell that nothing will ask."""
        self.mode = str(data.get("mode") or "") or None
        if self.mode != "full":
            return
        notice = ("⚠ full mode: this run's tool calls, writes and run_code included, run without asking you "
                  "(no consent card)")
        if self.surface in ("input", "headless"):
            print(f"relay: {notice}", flush=True)
            return
        from IPython.display import display

        self.view.pause()
        display({"text/html": chrome_html(f"<b>{esc(notice)}</b>"), "text/plain": notice}, raw=True)
        self.view.resume()

    def _timed_out(self, key: str, tool: Any) -> None:
        """Remember one timed-out consent (the cell fails at the end) and mark its card."""
        name = str(tool or self.steps.get(key, {}).get("tool") or "a tool")
        self.timeouts.setdefault(key or name, name)
        for card in self.cards.get(key, []):
            card.answered = True
            if not card.future.done():
                card.future.set_result(("timeout", "once"))
            if getattr(card, "outcome", None) != "timeout":
                card.mark("timeout", "once", "the broker", time.time())

    def end_cards(self, decision: str, who: str) -> None:
        """Mark every card still waiting (the cell was interrupted: no answer will come from it); a card left
        saying "waiting for your answer…" would be a lie in the saved notebook."""
        for cards in self.cards.values():
            for card in cards:
                if not card.future.done():
                    card.answered = True
                    card.future.set_result((decision, "once"))
                if getattr(card, "outcome", None) is None:
                    card.mark(decision, "once", who, time.time())

    def _raise_timeouts(self) -> None:
        if self.timeouts:
            names = ", ".join(visible(n, newlines=False) for n in dict.fromkeys(self.timeouts.values()))
            raise AgentError(message_for("PERMISSION_TIMEOUT",
                                         f"the permission request for {names} timed out and was denied"),
                             code=Code.PERMISSION_TIMEOUT)

    async def _permission(self, data: dict[str, Any]) -> None:
        self.view.pause()
        call_id = str(data.get("call_id", ""))
        request_id = str(data.get("request_id", ""))
        self.request_calls[request_id] = call_id or request_id
        self.steps.setdefault(call_id, {"tool": data.get("tool", "?"), "display": None})
        cards = self.cards.setdefault(call_id or request_id, [])
        asking = asyncio.ensure_future(ask(data, self.surface, self.session.policy, self.session.shell,
                                           on_card=cards.append))
        elsewhere = await self._watch_elsewhere(asking, request_id)
        if elsewhere is not None:
            # answered from another place (the owner's browser side panel), timed out, withdrawn, or
            # ended by the broker
            asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asking
            from .widgets.consent_card import answerer

            who = answerer(elsewhere.get("answered_by"))
            decision = str(elsewhere.get("decision") or "timeout")
            if elsewhere.get("_timeout") or decision == "timeout":
                decision = "timeout"
                self._timed_out(call_id or request_id, data.get("tool"))
            scope = str(elsewhere.get("scope") or "once")
            for card in cards:
                if not card.future.done():
                    card.answered = True
                    card.future.set_result((decision, scope))
                    card.mark(decision, scope, who, float(elsewhere.get("answered_at") or time.time()))
            if decision == "withdrawn" and self.surface == "input":
                print("relay: the permission request was withdrawn", flush=True)
            self.view.resume(INDICATOR)
            return
        answer: Answer = asking.result()
        decision = "allow" if answer.decision == "allow" else "deny"
        if answer.decision == "timeout":
            self._timed_out(call_id or request_id, data.get("tool"))
        try:
            await self.client.call(Method.PERMISSION_ANSWER, {"request_id": data.get("request_id"),
                                                              "decision": decision, "scope": answer.scope})
        except RpcError as exc:
            # the broker already decided (its own timeout, another answer): the run reports the outcome
            print(f"relay: answer not accepted: {exc.message}")
        self.view.resume(INDICATOR)

    async def _watch_elsewhere(self, asking: asyncio.Future[Answer], request_id: str) -> dict[str, Any] | None:
        """Wait for our own answer, while watching the run's events for this request being resolved
        elsewhere; other events that arrive meanwhile are kept, in order, for later."""
        assert self.queue is not None
        while not asking.done():
            getting = asyncio.ensure_future(self.queue.get())
            done, _ = await asyncio.wait({asking, getting}, return_when=asyncio.FIRST_COMPLETED)
            if getting not in done:
                getting.cancel()
                break
            event = getting.result()
            data = event.get("data") or {}
            kind = event.get("type")
            if str(data.get("request_id", "")) == request_id and kind in (EventType.PERMISSION_RESOLVED,
                                                                         EventType.PERMISSION_TIMEOUT):
                self.recorder.feed(kind, data)
                return {**data, "_timeout": kind == EventType.PERMISSION_TIMEOUT}
            if kind in TERMINAL_EVENTS or kind == "_lost":
                self.backlog.append(event)
                return {"decision": "cancelled", "answered_by": "the end of the run"}
            self.backlog.append(event)
        return None

    async def _elicitation(self, data: dict[str, Any]) -> None:
        """An MCP server's question (docs/mcp.md, "Elicitation"): a form card on the widget surface,
        declined in one line elsewhere; ended at once when the broker resolves it first (a kill, its
        deadline, the user's browser)."""
        from .widgets.elicitation_card import answer_elicitation

        self.view.pause()
        request_id = str(data.get("request_id", ""))
        cards: list[Any] = []
        asking = asyncio.ensure_future(answer_elicitation(
            data, self.surface, self.client, timeout=self.session.policy.timeout,
            method=Method.ELICITATION_ANSWER, on_card=cards.append))
        assert self.queue is not None
        while not asking.done():
            getting = asyncio.ensure_future(self.queue.get())
            done, _ = await asyncio.wait({asking, getting}, return_when=asyncio.FIRST_COMPLETED)
            if getting not in done:
                getting.cancel()
                break
            event = getting.result()
            edata = event.get("data") or {}
            if event.get("type") == EventType.ELICITATION_RESOLVED and str(edata.get("request_id")) == request_id:
                asking.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asking
                for card in cards:
                    card.mark(str(edata.get("action") or "decline"), str(edata.get("answered_by") or "the broker"),
                              float(edata.get("answered_at") or time.time()))
                break
            self.backlog.append(event)
        if asking.done() and not asking.cancelled() and asking.exception() is not None:
            print(f"relay: the answer to the MCP server's question was not sent: {asking.exception()}")
        self.view.resume(INDICATOR)

    def _elicitation_refused(self, data: dict[str, Any]) -> None:
        from .widgets.elicitation_card import refused_line

        self.view.pause()
        print(refused_line(data), flush=True)
        self.view.resume()

    async def _kernel_tool(self, data: dict[str, Any]) -> None:
        tool = str(data.get("tool", ""))
        arguments = data.get("arguments") if isinstance(data.get("arguments"), dict) else {}
        content, is_error = self.session.tools.call(tool, arguments)
        await self.client.call(Method.KERNEL_TOOL_RESULT, {"request_id": data.get("request_id"),
                                                           "content": content, "is_error": is_error})
