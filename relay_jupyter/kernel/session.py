"""One kernel's link to the broker: the client, the event pump, and running one ``%%agent`` cell.

The agent loop runs in the broker; a cell only starts a run and then follows its events: text is
rendered, permission requests become cards (or a prompt, or the headless policy), kernel-tool
requests run here, and the terminal event ends the cell -- with a one-line error when the run
failed, so there is no false green.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, cast

from ..core.errors import Code, RelayError
from ..protocol import kernel_wire as wire
from ..protocol.names import EventType, Method
from .client import Endpoint, RelayClient
from .consent import ConsentPolicy, detect_surface
from .conversations import ConversationBook, wire_cell_id
from .discovery import discover, is_anonymous_client_name, notebook_client_name, notebook_path
from .errors import AgentError, RpcError, as_agent_error
from .follower import RunFollower, Ticker
from .prewarm import wait_prewarm
from .provenance import ProvenanceRecorder, saved_records
from .render import StreamView, TextSink
from .rendering import visible
from .tools import KernelTools, summarize

__all__ = ["EventPump", "RunOptions", "Session"]

_BUFFER_RUNS = 32          # runs whose events may arrive before run.start returns their id
_BUFFER_EVENTS = 10_000    # per such run
# An idle pump (no run following) reconnects too: an outside MCP client's kernel tools for this notebook need its
# live stream (broker/mcp_gateway.py ``_notebook_kernel``). Backoff doubling from 0.2 s up to 30 s between tries,
# at most 40 tries in a row (about 17 minutes of a broker that stays away); the next cell's start() retries at once.
_IDLE_MAX_DELAY = 30.0
_IDLE_TRIES = 40


def _refused_field(exc: RpcError, name: str) -> bool:
    """Whether a broker refused the call's field ``name`` as unknown (``-32602`` with pydantic's
    ``extra_forbidden`` at that field): an older broker that does not take it."""
    errors = exc.data.get("errors") if isinstance(getattr(exc, "data", None), dict) else None
    return exc.rpc_code == -32602 and isinstance(errors, list) and any(
        isinstance(e, dict) and e.get("type") == "extra_forbidden" and e.get("loc") == [name] for e in errors)


def pre_checked(default_tools: list[str], name: object) -> bool:
    """Whether the connect card pre-checks the tool ``name`` (``c.RelayApp.default_tools``: names or ``*``)."""
    return "*" in default_tools or name in default_tools


async def _default_tools(client: RelayClient) -> list[str]:
    """``grants.defaults``' tools (``c.RelayApp.default_tools``); every tool for an older broker without it."""
    try:
        found = cast(wire.GrantsDefaultsResult, await client.call(Method.GRANTS_DEFAULTS, {}))
    except RpcError as exc:
        if exc.rpc_code != -32601:
            raise
        return ["*"]
    tools = found.get("tools") if isinstance(found, dict) else None
    return [str(t) for t in tools] if isinstance(tools, list) else ["*"]


@dataclass
class RunOptions:
    """Everything one ``%%agent`` cell asks for (parsed from the magic line)."""

    prompt: str
    model: str | None = None
    backend: str | None = None
    engine: str | None = None
    """``--engine``: what drives the run (None: the server's ``default_engine``)."""
    profile: str | None = None
    """``--profile``: a named upstream of the server (``c.RelayApp.profiles``); None: the server's own."""
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
    run registers. On a dropped stream it reconnects with ``since=<last id>`` so nothing is lost: while a run
    follows, up to 5 tries (then the run is told the stream is lost); while idle, with a longer backoff
    (``_IDLE_MAX_DELAY``, ``_IDLE_TRIES``) once it had been open, so the broker sees this kernel attached again
    without a cell (a first connect that fails ends at once: the cell says why). It stops for good while idle on a refused credential (a restarted kernel or a new key is needed, retrying cannot
    help), when the tries run out (the next cell's :meth:`start` opens it again) and when the kernel's loop ends.
    """

    def __init__(self, client: RelayClient) -> None:
        self.client = client
        self.queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.early: dict[str, list[dict[str, Any]]] = {}
        self.last_id: int | None = None
        self.connected = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.failure: AgentError | None = None
        self.tools: KernelTools | None = None
        """Runs the kernel tools an outside MCP client asks for through the gateway (requests with no run)."""
        self.served: dict[str, None] = {}   # those requests' ids, each run once (bounded)
        self.serving: set[asyncio.Task[None]] = set()
        self.reconnects = 0
        """How many times the stream opened again after it dropped (``relay`` tests and diagnostics)."""
        self._retry_now = asyncio.Event()
        """Set by :meth:`start`: a pump waiting out its backoff tries again at once (a cell is about to run)."""

    async def start(self, timeout: float = 10.0) -> None:
        """Connect (once) and wait until the subscription is live."""
        if self.task is None or self.task.done():
            self.connected.clear()
            self.failure = None
            self.task = asyncio.ensure_future(self._run())
        else:
            self._retry_now.set()
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
            if event.get("type") == EventType.KERNEL_TOOL_REQUEST:
                self._serve_tool(event.get("data") or {})
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

    def _serve_tool(self, data: dict[str, Any]) -> None:
        """A kernel-tool request of no run: an outside MCP client's call through relay's gateway, gated (and,
        for a write, approved in the side panel) by the broker, which sends it only while this kernel is the
        notebook's one attached kernel, live only (never replayed). Run once per request id."""
        request_id = data.get("request_id")
        if self.tools is None or not isinstance(request_id, str) or request_id in self.served:
            return
        self.served[request_id] = None
        while len(self.served) > 1000:
            self.served.pop(next(iter(self.served)))
        task = asyncio.ensure_future(self._answer_tool(request_id, data))
        self.serving.add(task)
        task.add_done_callback(self.serving.discard)

    async def _answer_tool(self, request_id: str, data: dict[str, Any]) -> None:
        assert self.tools is not None
        arguments = data.get("arguments") if isinstance(data.get("arguments"), dict) else {}
        content, is_error = self.tools.call(str(data.get("tool", "")), arguments)
        with contextlib.suppress(AgentError):  # the broker gone or the request over: nothing to tell anyone
            await self.client.call(Method.KERNEL_TOOL_RESULT, {"request_id": request_id, "content": content,
                                                               "is_error": is_error})

    async def _run(self) -> None:
        attempts = 0
        opened = False
        while True:
            try:
                async for event in self.client.events(self.last_id):
                    if event.get("type") == "_connected":
                        if opened:
                            self.reconnects += 1
                        opened = True
                        self.failure = None  # what broke an earlier stream is over
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
            refused = self.failure is not None and self.failure.code == Code.UNAUTHORIZED
            if self.queues and attempts > 5:
                lost = self.failure or AgentError("the relay event stream ended")
                for queue in self.queues.values():
                    queue.put_nowait({"type": "_lost", "data": {"message": lost.message}})
                return
            if not self.queues and (not opened or attempts > _IDLE_TRIES or refused):
                # never opened: the cell's start() says why at once; else the next cell's start() opens it again
                return
            delay = min(2.0 if self.queues else _IDLE_MAX_DELAY, 0.1 * 2 ** attempts)  # reconnect backoff
            self._retry_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry_now.wait(), delay)


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
        # after a restart a chat's turns come back from the saved notebook's provenance (lineage by cell id)
        self.book = ConversationBook(saved=lambda: saved_records(getattr(self.shell, "user_ns", None)))
        self.tools = KernelTools(shell)
        self.client: RelayClient | None = None
        self.pump: EventPump | None = None
        self.broker_lacks_cell_ids = False
        """The broker refused run.start's ``cell_id`` (older than cell ids): the kernel forks from memory."""
        self._connected_origin = False
        self._anonymous_noted = False
        self.grant_epoch = 0
        """Bumped whenever the grant state is set; a stale background ``grants.get`` must not undo a revoke."""
        self.runs: dict[str, asyncio.Task[Any]] = {}
        self.provenance: list[dict[str, Any]] = []
        """This kernel's answers' provenance records, newest last (``relay.provenance()``)."""
        self.prewarm_task: asyncio.Task[None] | None = None
        """The ``%load_ext`` pre-warm (``prewarm.py``) while the first cell has not waited for it."""
        self.prewarm_error: str | None = None
        """Why the pre-warm did not finish (never shown: the first cell redoes the step and reports)."""

    @property
    def connected_origin(self) -> bool:
        """Whether this notebook is known to have a grant (so the connect card is not needed)."""
        return self._connected_origin

    @connected_origin.setter
    def connected_origin(self, value: bool) -> None:
        self._connected_origin = bool(value)
        self.grant_epoch += 1

    def resolved_client_name(self) -> str:
        """``X-Relay-Client`` for this kernel: the configured name, or ``kernel:<notebook>``."""
        if self.client_name == "kernel":  # the default: name the notebook, so each gets its own origin on the daemon
            return notebook_client_name(getattr(self.shell, "user_ns", None))
        return self.client_name

    def notebook_claim(self) -> str | None:
        """This kernel's own guess at its notebook (:func:`~.discovery.notebook_path`), sent when it registers
        with a daemon; the daemon trusts what it sees of the kernel's process first (docs/daemon.md)."""
        return notebook_path(getattr(self.shell, "user_ns", None)) if self.client_name == "kernel" else None

    async def discover(self, *, start_daemon: bool) -> Endpoint:
        """The broker endpoint for this kernel (registered with a daemon: ``discovery.discover``)."""
        return await discover(client_name=self.resolved_client_name(), start_daemon=start_daemon,
                              notebook=self.notebook_claim())

    def adopt(self, client: RelayClient) -> RelayClient:
        """Use ``client`` from now on, with a fresh event pump."""
        self.client = client
        self.pump = EventPump(client)
        self.pump.tools = self.tools  # an outside MCP client's kernel tools (broker/mcp_gateway.py)
        self.broker_lacks_cell_ids = False  # another broker: it may take run.start's cell_id
        return client

    def drop_client(self) -> None:
        """Forget the endpoint and its pump (the next cell discovers the broker again)."""
        if self.pump is not None and self.pump.task is not None and not self.pump.task.done():
            self.pump.task.cancel()
        self.client = None
        self.pump = None

    async def get_client(self) -> RelayClient:
        """The broker client (discovered once per kernel)."""
        if self.client is None:
            endpoint = await self.discover(start_daemon=self.start_daemon)
            if self.client is None:
                self.adopt(RelayClient(endpoint))
        assert self.client is not None
        return self.client

    # ------------------------------------------------------------------ connect card
    async def refresh_grant(self, client: RelayClient, *, timeout: float | None = None) -> bool:
        """Ask the broker whether this notebook has a grant (``grants.get``); remember a yes. The one
        ``grants.get`` of the kernel: the first cell and the ``%load_ext`` pre-warm both use it.

        A yes only counts if nobody changed the grant state while the call was out (``relay.connect``,
        a revoke bump :attr:`grant_epoch`): a stale answer must not undo a revoke. A broker without
        ``grants.get`` (an older one) counts as connected: ``run.start`` then decides. Returns whether
        the notebook is now taken as connected.

        Raises:
            RpcError: any other refusal; BrokerUnreachable: no broker.
        """
        epoch = self.grant_epoch
        try:
            found = cast(wire.GrantsGetResult, await client.call(Method.GRANTS_GET, {}, timeout=timeout))
        except RpcError as exc:
            if exc.rpc_code != -32601:
                raise
            found = {"grant": cast(wire.GrantDict, {"origin": "?"})}  # no grants.get: let run.start decide
        grant = found.get("grant") if isinstance(found, dict) else None
        if grant and self.grant_epoch == epoch:
            self.connected_origin = True
        return self.connected_origin

    async def ensure_grant(self, surface: str, opts: RunOptions) -> None:
        """First use in a notebook: no grant yet -> the connect card (or a prompt / a clear error)."""
        if self.connected_origin:
            return
        client = await self.get_client()
        if await self.refresh_grant(client):
            return
        name = client.endpoint.client_name
        if is_anonymous_client_name(name) and not self._anonymous_noted:
            self._anonymous_noted = True  # one line, once per kernel
            print(f"relay: this kernel does not know its notebook's path, so it has an origin of its own ({name}); "
                  "set RELAY_NOTEBOOK=<path> for the kernel to keep grants and budgets per notebook")
        if surface == "headless":
            auth = client.endpoint.auth or ""
            # on the daemon the origin is daemon:<client name>: name it, so the terminal grant is one copy-paste
            grant = (f"`jupyter relay grants add daemon:{name} --tools ...`" if not auth.startswith("RelayKernel ")
                     else "`jupyter relay grants add`")
            raise AgentError("this notebook has no relay grant and nobody can click Connect here (headless); run "
                             f"%%agent once interactively or use {grant}", code=Code.UNAUTHORIZED)
        listed = cast(wire.ToolsListResult, await client.call(Method.TOOLS_LIST, {}))
        tools = list((listed or {}).get("tools", [])) if isinstance(listed, dict) else []
        model = opts.model or self.default_model or "*"
        checked = await _default_tools(client)
        budget: wire.BudgetDict = {"tokens_per_day": 200_000, "cost_per_day_usd": 5.0, "requests_per_minute": 30.0}
        if surface == "input":
            names = [str(t.get("name")) for t in tools if pre_checked(checked, t.get("name"))]
            shown = visible(", ".join(names), newlines=False) or "none"
            print(f"relay: connect this notebook? model {visible(model, newlines=False)}; tools {shown}; budget {budget}")
            reply = input("Connect? [y/N]: ").strip().lower()
            request: wire.GrantsCreateParams | None = (
                {"tools": names, "models": [model], "budget": budget} if reply.startswith("y") else None)
        else:
            from .widgets.connect_card import ConnectCard

            card = ConnectCard(model, tools, budget, checked=checked)
            card.show()
            request = await card.wait(self.policy.timeout)
        if request is None:
            raise AgentError("not connected: the agent needs a grant for this notebook (Connect was not clicked)",
                             code=Code.UNAUTHORIZED)
        await client.call(Method.GRANTS_CREATE, request)
        self.connected_origin = True

    async def _prepare(self, surface: str, opts: RunOptions) -> None:
        """The grant check (maybe the connect card) and opening the event stream, concurrently: they are
        independent, and each is a round trip to the broker. A grant failure wins over a stream failure,
        so the messages are the ones the sequential order gave."""
        assert self.pump is not None
        grant, stream = await asyncio.gather(self.ensure_grant(surface, opts), self.pump.start(),
                                             return_exceptions=True)
        for outcome in (grant, stream):
            if isinstance(outcome, BaseException):
                raise outcome

    # ------------------------------------------------------------------ one cell
    def _attachments(self, names: list[str]) -> list[wire.RunAttachment]:
        out: list[wire.RunAttachment] = []
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
        try:
            return await self._run(opts)
        except RelayError as exc:
            error = as_agent_error(exc)  # one family: a core refusal met here prints as one line too
            if error.code == Code.UNAUTHORIZED:
                # the grant this kernel remembered is gone (revoked from the side panel, the notebook was
                # renamed, it expired): forget it, so the next cell asks again with the connect card
                self.connected_origin = False
            if error is exc:
                raise
            raise error from None

    async def _fork_from_memory(self, client: RelayClient, chat: Any, fork_at: int | None) -> int | None:
        """The kernel-side fork of an older broker: ``conversations.fork`` at the turn this kernel remembers for the
        cell; None (append) when it remembers none or the broker does not have the conversation."""
        if fork_at is None:
            return None
        try:
            await client.call(Method.CONVERSATIONS_FORK, {"conversation": chat.conversation, "at_turn": fork_at})
        except RpcError as exc:
            if exc.code != Code.NOT_FOUND:
                raise
            chat.turns.clear()
            return None
        return fork_at

    async def _run(self, opts: RunOptions) -> str:
        surface = detect_surface(self.shell, self.policy.surface)
        attachments = self._attachments(opts.variables)
        await wait_prewarm(self)
        client = await self.get_client()
        await self._prepare(surface, opts)
        assert self.pump is not None
        opts.cell_id = wire_cell_id(opts.cell_id)
        chat = self.book.chat(opts.chat, new=opts.new)
        # the broker forks at the cell's turn (it stores each turn's cell id: run.start cell_id), so a re-run
        # after a restart, another day or an unsaved notebook replaces its turn; the kernel's book only names
        # the chat's conversation and guesses the lineage until the broker's run.turn event says it
        fork_at = self.book.fork_point(chat, opts.cell_id)
        params: wire.RunStartParams = {"conversation": chat.conversation, "prompt": opts.prompt,
                                       "attachments": attachments, "model": opts.model or self.default_model,
                                       "backend": opts.backend or self.default_backend, "engine": opts.engine,
                                       "profile": opts.profile, "mode": cast(Any, opts.mode),
                                       "max_tokens": opts.max_tokens, "tools": opts.tools,
                                       "cell_id": opts.cell_id}
        payload = {k: v for k, v in params.items() if v is not None}
        if self.broker_lacks_cell_ids and "cell_id" in payload:
            fork_at = await self._fork_from_memory(client, chat, fork_at)
            del payload["cell_id"]
        try:
            started = cast(wire.RunStartResult, await client.call(Method.RUN_START, payload))
        except RpcError as exc:
            if "cell_id" not in payload or not _refused_field(exc, "cell_id"):
                raise
            # a broker from before cell ids (a daemon still running from an older install): fork from what this
            # kernel remembers, as that version did, and start without the field (from now on: no second try)
            self.broker_lacks_cell_ids = True
            fork_at = await self._fork_from_memory(client, chat, fork_at)
            del payload["cell_id"]
            started = cast(wire.RunStartResult, await client.call(Method.RUN_START, payload))
        run_id = str((started or {}).get("run_id"))
        turn = self.book.record(chat, fork_at, opts.cell_id)
        queue = self.pump.register(run_id)
        view = StreamView(TextSink() if surface == "input" else None, interval=self.update_interval)
        recorder = ProvenanceRecorder(run_id, conversation=chat.conversation, chat=opts.chat, cell_id=opts.cell_id,
                                      requested_model=opts.model or self.default_model,
                                      requested_backend=opts.backend or self.default_backend,
                                      turn=turn, parent_cells=chat.turns[:turn])
        follower = RunFollower(self, client, run_id, view, surface, recorder)
        ticker = Ticker(asyncio.get_running_loop())
        try:
            return await follower.follow(queue)
        except (asyncio.CancelledError, KeyboardInterrupt):
            with contextlib.suppress(Exception):
                await asyncio.shield(client.call(Method.RUN_CANCEL, {"run_id": run_id}, timeout=3.0))
            follower.end_cards("cancelled", "the interrupt")
            view.finish("✗ *interrupted*")
            # the cell's own coroutine: end it with one line rather than a CancelledError traceback
            raise AgentError(f"interrupted: run {run_id} was cancelled", code=Code.CANCELLED) from None
        finally:
            ticker.stop()
            self.pump.unregister(run_id)
            lineage = recorder.record["lineage"]
            if lineage["turn"] is not None and len(lineage["parent_cells"]) == lineage["turn"]:
                chat.turns = [*lineage["parent_cells"], opts.cell_id]  # the broker's word, when it said it
