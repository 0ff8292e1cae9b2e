"""Helpers for the runtime tests: a real gate over the in-memory ports, event recording, test tools,
and the two fake model servers behind the real backends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import RetryPolicy
from relay_jupyter.backends.openai import OpenAIBackend
from relay_jupyter.core.budgets import BudgetLedger
from relay_jupyter.core.gate import Gate
from relay_jupyter.core.grants import GrantBook
from relay_jupyter.core.memory import MemoryAuditSink, MemoryGrantStore, MemoryLedger, MemoryRunJournal
from relay_jupyter.core.pricing import Pricing
from relay_jupyter.core.types import (
    Budget,
    ConsentDecision,
    ConsentRequest,
    ConsentResult,
    Grant,
    ToolClass,
    ToolSpec,
)
from relay_jupyter.protocol.names import TERMINAL_EVENTS
from relay_jupyter.runtime.conversations import MemoryConversations
from relay_jupyter.runtime.manager import RunContext, RunManager, RunParams, RuntimeConfig
from relay_jupyter.runtime.tools import LocalTools
from relay_jupyter.testing import FakeAnthropic, FakeOpenAI

ORIGIN = "notebook:work/a.ipynb#k1"
CLIENT = "client-1"
KEY = "sk-test-runtime-key-0123456789"
MODELS = {"anthropic": "claude-test-1", "openai": "gpt-fake-1"}


class Recorder:
    """An events sink (``append(type, data, origin=, run_id=)``) that tests can wait on."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any], str | None, str | None]] = []
        self._changed = asyncio.Event()

    def append(self, type: str, data: dict[str, Any] | None = None, *, origin: str | None = None,
               run_id: str | None = None) -> None:
        json.dumps(data)  # every event must be JSON-serialisable
        self.events.append((type, dict(data or {}), origin, run_id))
        self._changed.set()

    def publish_stored(self, events: list[Any], frames: Any = None) -> None:
        """Events the store committed in a transaction of its own (a run's terminal event, committed
        with the journal's terminal state): recorded as the EventBus would deliver them."""
        for e in events:
            self.append(e.type, e.data, origin=e.origin, run_id=e.run_id)

    def append_soon(self, type: str, data: dict[str, Any], *, origin: str | None, run_id: str | None,
                    on_error: Any) -> None:
        """Group commit as the EventBus does it is the bus's concern: a recorder keeps the event at once."""
        self.append(type, data, origin=origin, run_id=run_id)

    def flush(self) -> None:
        """Nothing is queued here."""

    def publish_unstored(self, type: str, data: dict[str, Any], origin: str | None, run_id: str | None) -> None:
        """An event the store could not record, delivered live only (as the EventBus marks it)."""
        self.append(type, {**data, "stored": False}, origin=origin, run_id=run_id)

    def types(self, run_id: str | None = None) -> list[str]:
        return [t for t, _, _, r in self.events if run_id is None or r == run_id]

    def of(self, type: str, run_id: str | None = None) -> list[dict[str, Any]]:
        return [d for t, d, _, r in self.events if t == type and (run_id is None or r == run_id)]

    async def wait_for(self, type: str, run_id: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                found = self.of(type, run_id)
                if found:
                    return found[0]
                self._changed.clear()
                await self._changed.wait()

    async def terminal(self, run_id: str, timeout: float = 10.0) -> str:
        async with asyncio.timeout(timeout):
            while True:
                found = [t for t in self.types(run_id) if t in TERMINAL_EVENTS]
                if found:
                    return found[0]
                self._changed.clear()
                await self._changed.wait()


class DelayedConsent:
    """A consent port that answers after ``delay`` seconds (a human taking a moment to click)."""

    def __init__(self, decision: ConsentDecision, delay: float = 0.05) -> None:
        self.decision = decision
        self.delay = delay
        self.asked: list[ConsentRequest] = []
        self.answered = asyncio.Event()

    async def ask(self, request: ConsentRequest) -> ConsentResult:
        self.asked.append(request)
        await asyncio.sleep(self.delay)
        self.answered.set()
        return ConsentResult(decision=self.decision, answered_by=CLIENT)


@dataclass
class Tools:
    """Test tools: a read, a write (records its calls), a slow write (blocks until released)."""

    notes: str = "note contents"
    written: list[dict[str, Any]] = field(default_factory=list)
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    reads: int = 0

    def provider(self) -> LocalTools:
        tools = LocalTools()
        tools.add(ToolSpec(name="read_note", description="Read the note.", tool_class=ToolClass.READ,
                           input_schema={"type": "object", "properties": {}, "additionalProperties": False},
                           parallel_safe=True), self._read)
        tools.add(ToolSpec(name="write_file", description="Write a file.", tool_class=ToolClass.WRITE,
                           input_schema={"type": "object", "required": ["path", "content"],
                                         "properties": {"path": {"type": "string"},
                                                        "content": {"type": "string"}},
                                         "additionalProperties": False}), self._write)
        tools.add(ToolSpec(name="slow_write", description="Slow.", tool_class=ToolClass.WRITE,
                           input_schema={"type": "object"}), self._slow)
        return tools

    def _read(self, args: dict[str, Any]) -> str:
        self.reads += 1
        return self.notes

    def _write(self, args: dict[str, Any]) -> str:
        self.written.append(args)
        return f"wrote {len(args['content'])} characters to {args['path']}"

    async def _slow(self, args: dict[str, Any]) -> str:
        self.slow_started.set()
        await self.release.wait()
        self.written.append(args)
        return "slow done"


@dataclass
class Rig:
    manager: RunManager
    events: Recorder
    tools: Tools
    journal: MemoryRunJournal
    conversations: MemoryConversations
    audit: MemoryAuditSink
    book: GrantBook
    fake: Any
    backend_name: str

    @property
    def model(self) -> str:
        return MODELS[self.backend_name]

    def ctx(self, conversation: str = "conv-1") -> RunContext:
        return RunContext(origin=ORIGIN, client_id=CLIENT, conversation=conversation)

    def params(self, prompt: str = "do the thing", **kw: Any) -> RunParams:
        kw.setdefault("model", self.model)
        kw.setdefault("backend", self.backend_name)
        return RunParams(prompt=prompt, **kw)

    async def run(self, prompt: str = "do the thing", **kw: Any) -> tuple[str, str]:
        run_id = await self.manager.start(self.ctx(), self.params(prompt, **kw))
        return run_id, await self.events.terminal(run_id)

    def history(self, conversation: str = "conv-1") -> list[dict[str, Any]]:
        row = self.conversations.load_conversation(conversation)
        return row["messages"] if row else []


def make_gate(budget: Budget | None = None) -> tuple[Gate, GrantBook, MemoryAuditSink]:
    book = GrantBook(MemoryGrantStore(), cache_ttl=0)
    audit = MemoryAuditSink()
    gate = Gate(grants=book, ledger=BudgetLedger(MemoryLedger()), audit=audit, pricing=Pricing(),
                consent_timeout=5.0)
    book.issue(Grant(origin=ORIGIN, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c1",
                     budget=budget or Budget(requests_per_minute=10_000, tokens_per_day=10_000_000,
                                             cost_per_day_usd=1000.0, max_steps_per_run=50,
                                             max_tokens_per_run=1_000_000)))
    return gate, book, audit


def make_backend(name: str, fake: Any):
    retry = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=5.0, max_total_wait=5.0)
    if name == "anthropic":
        return AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",), retry=retry, timeout=10)
    return OpenAIBackend(fake.base_url, KEY, models=("gpt-fake-*",), retry=retry, timeout=10)


@contextmanager
def fake_server(name: str) -> Iterator[Any]:
    cls = FakeAnthropic if name == "anthropic" else FakeOpenAI
    with cls(api_key=KEY) as fake:
        yield fake


def make_rig(name: str, fake: Any, *, consent: Any = None, budget: Budget | None = None,
             config: RuntimeConfig | None = None, extra_backends: dict[str, Any] | None = None) -> Rig:
    gate, book, audit = make_gate(budget)
    events, tools = Recorder(), Tools()
    journal, conversations = MemoryRunJournal(), MemoryConversations()
    backends = {name: make_backend(name, fake), **(extra_backends or {})}
    manager = RunManager(gate, journal, conversations, events, [tools.provider()], backends,
                         config or RuntimeConfig(coalesce_interval=0.02), consent=consent)
    return Rig(manager, events, tools, journal, conversations, audit, book, fake, name)


def tool_results(body: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(call_id, content, is_error) of every tool result in a recorded request body, either API."""
    found = []
    for m in body.get("messages", []):
        if m.get("role") == "tool":
            content = m["content"]
            found.append((m["tool_call_id"], content, content.startswith("ERROR: ")))
        elif isinstance(m.get("content"), list):
            for b in m["content"]:
                if b.get("type") == "tool_result":
                    found.append((b["tool_use_id"], b["content"], bool(b.get("is_error"))))
    return found
