"""One kernel's link to the broker: the client, the event pump, and running one ``%%agent`` cell.

The agent loop runs in the broker; a cell only starts a run and then follows its events: text is
rendered, permission requests become cards (or a prompt, or the headless policy), kernel-tool
requests run here, and the terminal event ends the cell -- with a one-line error when the run
failed, so there is no false green.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from ..protocol.names import TERMINAL_EVENTS, EventType, Method
from .client import RelayClient
from .consent import Answer, ConsentPolicy, ask, detect_surface
from .conversations import ConversationBook
from .discovery import discover
from .errors import AgentError, RpcError, message_for
from .render import StreamView, TextSink
from .tools import KernelTools, summarize

__all__ = ["EventPump", "RunOptions", "Session"]

_BUFFER_RUNS = 32          # runs whose events may arrive before run.start returns their id
_BUFFER_EVENTS = 10_000    # per such run


@dataclass
class RunOptions:
    """Everything one ``%%agent`` cell asks for (parsed from the magic line)."""

    prompt: str
    model: str | None = None
    backend: str | None = None
    chat: str = "default"
    new: bool = False
    mode: str | None = None
    max_tokens: int | None = None
    tools: list[str] | None = None
    """None = the grant's tools; [] = no tools (``--no-tools``)."""
    variables: list[str] = field(default_factory=list)
    background: bool = False
    cell_id: str | None = None


class EventPump:
    """Reads the SSE stream once for the whole kernel and hands each run its events.

    Events can arrive before ``run.start`` returns the run id; those are held (bounded) until the
    run registers. On a dropped stream it reconnects with ``since=<last id>`` so nothing is lost.
    """

    def __init__(self, client: RelayClient) -> None:
        self.client = client
        self.queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.early: dict[str, list[dict[str, Any]]] = {}
        self.last_id: int | None = None
        self.connected = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.failure: AgentError | None = None

    async def start(self, timeout: float = 10.0) -> None:
        """Connect (once) and wait until the subscription is live."""
        if self.task is None or self.task.done():
            self.connected.clear()
            self.failure = None
            self.task = asyncio.ensure_future(self._run())
        wait_connected = asyncio.ensure_future(self.connected.wait())
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait({wait_connected, self.task}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise AgentError("the relay broker's event stream did not open in time") from None
        finally:
            wait_connected.cancel()
        if not self.connected.is_set():
            raise self.failure or AgentError("the relay broker's event stream closed")

    def register(self, run_id: str) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for event in self.early.pop(run_id, []):
            queue.put_nowait(event)
        self.queues[run_id] = queue
        return queue

    def unregister(self, run_id: str) -> None:
        self.queues.pop(run_id, None)

    def _dispatch(self, event: dict[str, Any]) -> None:
        run_id = event.get("run_id") or (event.get("data") or {}).get("run_id")
        if not isinstance(run_id, str):
            return
        queue = self.queues.get(run_id)
        if queue is not None:
            queue.put_nowait(event)
            return
        held = self.early.setdefault(run_id, [])
        if len(held) < _BUFFER_EVENTS:
            held.append(event)
        while len(self.early) > _BUFFER_RUNS:
            self.early.pop(next(iter(self.early)))

    async def _run(self) -> None:
        attempts = 0
        while True:
            try:
                async for event in self.client.events(self.last_id):
                    if event.get("type") == "_connected":
                        self.connected.set()
                        attempts = 0
                        continue
                    if isinstance(event.get("id"), int):
                        self.last_id = event["id"]
                    self._dispatch(event)
            except AgentError as exc:
                self.failure = exc
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                self.failure = AgentError(f"the relay event stream broke ({type(exc).__name__})")
            attempts += 1
            if not self.queues or attempts > 5:
                lost = self.failure or AgentError("the relay event stream ended")
                for queue in self.queues.values():
                    queue.put_nowait({"type": "_lost", "data": {"message": lost.message}})
                return
            await asyncio.sleep(min(2.0, 0.1 * 2 ** attempts))  # reconnect backoff


class Session:
    """Per-kernel state: endpoint, pump, conversations, consent policy, kernel tools."""

    def __init__(self, shell: Any, *, policy: ConsentPolicy | None = None, client_name: str = "kernel",
                 default_model: str | None = None, default_backend: str | None = None,
                 update_interval: float = 0.1, start_daemon: bool = True) -> None:
        self.shell = shell
        self.policy = policy or ConsentPolicy()
        self.client_name = client_name
        self.default_model = default_model
        self.default_backend = default_backend
        self.update_interval = update_interval
        self.start_daemon = start_daemon
        self.book = ConversationBook()
        self.tools = KernelTools(shell)
        self.client: RelayClient | None = None
        self.pump: EventPump | None = None
        self.connected_origin = False
        self.runs: dict[str, asyncio.Task[Any]] = {}

    async def get_client(self) -> RelayClient:
        """The broker client (discovered once per kernel)."""
        if self.client is None:
            self.client = RelayClient(await discover(client_name=self.client_name, start_daemon=self.start_daemon))
            self.pump = EventPump(self.client)
        return self.client

    # ------------------------------------------------------------------ connect card
    async def ensure_grant(self, surface: str, opts: RunOptions) -> None:
        """First use in a notebook: no grant yet -> the connect card (or a prompt / a clear error)."""
        if self.connected_origin:
            return
        client = await self.get_client()
        try:
            found = await client.call(Method.GRANTS_GET, {})
        except RpcError as exc:
            if exc.rpc_code == -32601:  # a broker without grants.get: let run.start decide
                self.connected_origin = True
                return
            raise
        grant = found.get("grant") if isinstance(found, dict) and "grant" in found else found
        if grant:
            self.connected_origin = True
            return
        if surface == "headless":
            raise AgentError("this notebook has no relay grant and nobody can click Connect here (headless); run "
                             "%%agent once interactively or use `jupyter relay grants add`", code="UNAUTHORIZED")
        listed = await client.call(Method.TOOLS_LIST, {})
        tools = list((listed or {}).get("tools", [])) if isinstance(listed, dict) else []
        model = opts.model or self.default_model or "*"
        budget = {"tokens_per_day": 200_000, "cost_per_day_usd": 5.0, "requests_per_minute": 30.0}
        if surface == "input":
            names = [str(t.get("name")) for t in tools]
            print(f"relay: connect this notebook? model {model}; tools {', '.join(names) or 'none'}; budget {budget}")
            reply = input("Connect? [y/N]: ").strip().lower()
            request = {"tools": names, "models": [model], "budget": budget} if reply.startswith("y") else None
        else:
            from .widgets.connect_card import ConnectCard

            card = ConnectCard(model, tools, budget)
            card.show()
            request = await card.wait(self.policy.timeout)
        if request is None:
            raise AgentError("not connected: the agent needs a grant for this notebook (Connect was not clicked)",
                             code="UNAUTHORIZED")
        await client.call(Method.GRANTS_CREATE, request)
        self.connected_origin = True

    # ------------------------------------------------------------------ one cell
    def _attachments(self, names: list[str]) -> list[dict[str, Any]]:
        out = []
        for name in names:
            if name not in self.shell.user_ns:
                raise AgentError(f"--var {name}: no such variable in this kernel")
            # the runtime wraps each attachment as labeled untrusted user-role content
            out.append({"label": f"kernel variable {name}", "content": summarize(name, self.shell.user_ns[name])})
        return out

    async def run(self, opts: RunOptions) -> str:
        """Run one agent turn for a cell and render it; returns the answer text.

        Raises:
            AgentError: a one-line, actionable failure (the cell fails).
        """
        surface = detect_surface(self.shell, self.policy.surface)
        attachments = self._attachments(opts.variables)
        client = await self.get_client()
        await self.ensure_grant(surface, opts)
        assert self.pump is not None
        await self.pump.start()
        chat = self.book.chat(opts.chat, new=opts.new)
        fork_at = self.book.fork_point(chat, opts.cell_id)
        if fork_at is not None:
            await client.call(Method.CONVERSATIONS_FORK, {"conversation": chat.conversation, "at_turn": fork_at})
        params: dict[str, Any] = {"conversation": chat.conversation, "prompt": opts.prompt,
                                  "attachments": attachments, "model": opts.model or self.default_model,
                                  "backend": opts.backend or self.default_backend, "mode": opts.mode,
                                  "max_tokens": opts.max_tokens, "tools": opts.tools}
        started = await client.call(Method.RUN_START, {k: v for k, v in params.items() if v is not None})
        run_id = str((started or {}).get("run_id"))
        self.book.record(chat, fork_at, opts.cell_id)
        queue = self.pump.register(run_id)
        view = StreamView(TextSink() if surface == "input" else None, interval=self.update_interval)
        follower = RunFollower(self, client, run_id, view, surface)
        ticker = _Ticker(asyncio.get_running_loop())
        try:
            return await follower.follow(queue)
        except (asyncio.CancelledError, KeyboardInterrupt):
            with contextlib.suppress(Exception):
                await asyncio.shield(client.call(Method.RUN_CANCEL, {"run_id": run_id}, timeout=3.0))
            view.finish("⏹ *interrupted*")
            # the cell's own coroutine: end it with one line rather than a CancelledError traceback
            raise AgentError(f"interrupted: run {run_id} was cancelled", code="CANCELLED") from None
        finally:
            ticker.stop()
            self.pump.unregister(run_id)


class _Ticker:
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

    def __init__(self, session: Session, client: RelayClient, run_id: str, view: StreamView, surface: str) -> None:
        self.session = session
        self.client = client
        self.run_id = run_id
        self.view = view
        self.surface = surface
        self.started = time.monotonic()
        self.tokens = 0
        self.cost = 0.0
        self.timeouts: list[str] = []
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
            if kind in (EventType.PERMISSION_REQUEST, EventType.KERNEL_TOOL_REQUEST):
                if request_id in self.seen_requests:
                    continue
                self.seen_requests.add(request_id)
            if kind == EventType.TEXT_DELTA:
                self.view.text(str(data.get("text", "")))
            elif kind == EventType.PERMISSION_REQUEST:
                await self._permission(data)
            elif kind == EventType.KERNEL_TOOL_REQUEST:
                await self._kernel_tool(data)
            elif kind in (EventType.TOOL_PROPOSED, EventType.TOOL_DECIDED, EventType.TOOL_FINISHED):
                self._step(kind, data)
            elif kind == EventType.PERMISSION_TIMEOUT:
                self.timeouts.append(str(data.get("tool") or data.get("request_id") or "a tool"))
            elif kind == EventType.USAGE:
                self.tokens += sum(int(data.get(k) or 0) for k in (
                    "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
                self.cost += float(data.get("cost_usd") or 0.0)
            elif kind in TERMINAL_EVENTS or kind == "_lost":
                return self._end(kind, data)

    def _footer(self, mark: str) -> str:
        cost = f" · ${self.cost:.4f}" if self.cost else ""
        return f"{mark} · {time.monotonic() - self.started:.1f} s · {self.tokens:,} tokens{cost} · run `{self.run_id}`"

    def _end(self, kind: str | None, data: dict[str, Any]) -> str:
        if kind == EventType.DONE:
            answer = self.view.finish(self._footer("✓ *done*"))
            if self.timeouts:
                raise AgentError(f"permission request for {', '.join(self.timeouts)} timed out and was denied",
                                 code="PERMISSION_TIMEOUT")
            return answer
        self.view.finish(self._footer(f"✗ *{str(kind).removeprefix('run.')}*"))
        if kind == EventType.BUDGET_EXHAUSTED:
            raise AgentError(message_for("BUDGET_EXCEEDED", str(data.get("message") or "budget exhausted")),
                             code="BUDGET_EXCEEDED")
        if kind == EventType.CANCELLED:
            raise AgentError("the run was cancelled", code="CANCELLED")
        if kind == EventType.INTERRUPTED:
            raise AgentError("the run was interrupted (the broker restarted); re-run the cell", code="INTERRUPTED")
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
        if self.surface == "input":
            return
        from .markdown import escape_markdown

        name = str(step["tool"]).replace("`", "'")[:120]
        state = step.get("decision") or "proposed"
        if step.get("code"):
            state += f" ({escape_markdown(str(step['code']))[:60]})"
        if "ms" in step:
            state += f" · {'failed' if step.get('error') else 'done'} in {float(step['ms'] or 0):.0f} ms"
        line = f"🔧 `{name}` — {state}"
        from IPython.display import display, update_display

        if step["display"] is None:
            self.view.pause()
            step["display"] = f"relay-step-{self.run_id}-{call_id}"
            display({"text/markdown": line}, raw=True, display_id=step["display"])
            self.view.resume()
        else:
            update_display({"text/markdown": line}, raw=True, display_id=step["display"])

    async def _permission(self, data: dict[str, Any]) -> None:
        self.view.pause()
        self.steps.setdefault(str(data.get("call_id", "")), {"tool": data.get("tool", "?"), "display": None})
        cards: list[Any] = []
        asking = asyncio.ensure_future(ask(data, self.surface, self.session.policy, self.session.shell,
                                           on_card=cards.append))
        elsewhere = await self._watch_elsewhere(asking, str(data.get("request_id", "")))
        if elsewhere is not None:
            # answered from another place (the owner's browser side panel) or ended by the broker
            asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asking
            who = elsewhere.get("answered_by") or "the broker"
            decision = str(elsewhere.get("decision") or "timeout")
            if elsewhere.get("_timeout"):
                self.timeouts.append(str(data.get("tool") or "a tool"))
            for card in cards:
                if not card.future.done():
                    card.answered = True
                    card.future.set_result((decision, str(elsewhere.get("scope") or "once")))
                    card.mark(decision, str(elsewhere.get("scope") or "once"), str(who),
                              float(elsewhere.get("answered_at") or time.time()))
            self.view.resume("⏳ *working…*")
            return
        answer: Answer = asking.result()
        decision = "allow" if answer.decision == "allow" else "deny"
        if answer.decision == "timeout":
            self.timeouts.append(str(data.get("tool") or "a tool"))
        try:
            await self.client.call(Method.PERMISSION_ANSWER, {"request_id": data.get("request_id"),
                                                              "decision": decision, "scope": answer.scope})
        except RpcError as exc:
            # the broker already decided (its own timeout, another answer): the run reports the outcome
            print(f"relay: answer not accepted: {exc.message}")
        self.view.resume("⏳ *working…*")

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
                return {**data, "_timeout": kind == EventType.PERMISSION_TIMEOUT}
            if kind in TERMINAL_EVENTS or kind == "_lost":
                self.backlog.append(event)
                return {"decision": "cancelled", "answered_by": "the end of the run"}
            self.backlog.append(event)
        return None

    async def _kernel_tool(self, data: dict[str, Any]) -> None:
        tool = str(data.get("tool", ""))
        arguments = data.get("arguments") if isinstance(data.get("arguments"), dict) else {}
        content, is_error = self.session.tools.call(tool, arguments)
        await self.client.call(Method.KERNEL_TOOL_RESULT, {"request_id": data.get("request_id"),
                                                           "content": content, "is_error": is_error})
