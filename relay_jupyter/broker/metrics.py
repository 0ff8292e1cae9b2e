"""Prometheus metrics of one broker (its own registry, so two brokers in one process stay apart).

Counters never carry a caller-chosen string as a label value: an unknown RPC method is counted as
``_unknown`` so a hostile client cannot grow the label set. Nothing secret is ever a label.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.ports import AuditSink
from ..core.telemetry import TelemetryRow
from ..core.types import AuditRecord

__all__ = ["CONTENT_TYPE", "LAG_BUCKETS", "LAG_INTERVAL", "LATENCY_BUCKETS", "TTFT_BUCKETS", "BrokerMetrics",
           "CountingAudit"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Seconds between two wake-ups of the event-loop lag probe.
LAG_INTERVAL = 0.05
#: Histogram buckets of ``relay_event_loop_lag_seconds`` (the issue 18 target is p99 <= 20 ms).
LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
#: Buckets of ``relay_model_request_seconds`` (a whole model request: a long answer takes minutes).
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Buckets of ``relay_model_ttft_seconds`` (time to the first answer event).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_SOURCES = frozenset({"proxy", "agent"})


class _LiveGauges(Collector):
    """Gauges computed at scrape time from the broker's live state."""

    def __init__(self, read: Callable[[], dict[str, float]]) -> None:
        self._read = read

    def collect(self):  # type: ignore[override]
        values = self._read()
        for name, help_text in (
            ("relay_active_runs", "Runs started and not yet finished."),
            ("relay_event_lag_events", "Events buffered for the slowest live SSE subscriber."),
            ("relay_sse_subscribers", "Live SSE subscribers."),
            ("relay_last_event_id", "Id of the newest stored event."),
            ("relay_pending_permissions", "Permission requests waiting for an answer."),
        ):
            yield GaugeMetricFamily(name, help_text, value=float(values.get(name, 0.0)))


class BrokerMetrics:
    """The counters the handlers and the gate update, and the scrape output."""

    def __init__(self, known_methods: Callable[[], set[str]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._known = known_methods
        self.requests = Counter("relay_rpc_requests", "JSON-RPC requests by method and outcome.",
                                ["method", "outcome"], registry=self.registry)
        self.decisions = Counter("relay_decisions", "Gate decisions by decision and refusal code.",
                                 ["decision", "code"], registry=self.registry)
        self.http = Counter("relay_http_requests", "HTTP requests to relay endpoints by endpoint and status.",
                            ["endpoint", "status"], registry=self.registry)
        self.sse_disconnects = Counter("relay_sse_disconnects", "SSE subscribers disconnected, by reason.",
                                       ["reason"], registry=self.registry)
        self.events_sent = Counter("relay_sse_events_sent", "Events written to SSE subscribers.",
                                   registry=self.registry)
        self.loop_lag = Histogram(
            "relay_event_loop_lag_seconds",
            f"How late the broker's event loop ran a {LAG_INTERVAL}s timer: the time one callback or "
            "RPC held the loop (every stream and request waits that long).",
            buckets=LAG_BUCKETS, registry=self.registry)
        # per model request (core/telemetry.py rows): labels are the fixed source and status sets only,
        # never the model id (a client picks it) or the origin (unbounded)
        self.model_latency = Histogram(
            "relay_model_request_seconds", "Duration of model requests (endpoints and %%agent turns), by source.",
            ["source"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.model_ttft = Histogram(
            "relay_model_ttft_seconds", "Time to the first answer event of model requests, by source.",
            ["source"], buckets=TTFT_BUCKETS, registry=self.registry)
        self.model_requests = Counter("relay_model_requests", "Model requests by source and status.",
                                      ["source", "status"], registry=self.registry)
        self.model_tokens = Counter("relay_model_tokens", "Tokens charged for model requests, by source and kind.",
                                    ["source", "kind"], registry=self.registry)
        self.model_cost = Counter("relay_model_cost_usd", "USD charged for model requests, by source.",
                                  ["source"], registry=self.registry)
        self._live: _LiveGauges | None = None
        self._lag_task: asyncio.Task[None] | None = None

    def start_loop_probe(self, interval: float = LAG_INTERVAL) -> None:
        """Start measuring the running event loop's lag (once; :meth:`stop_loop_probe` ends it)."""
        if self._lag_task is None or self._lag_task.done():
            self._lag_task = asyncio.get_running_loop().create_task(self._probe(interval))

    def stop_loop_probe(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
            self._lag_task = None

    async def _probe(self, interval: float) -> None:
        clock = time.monotonic
        while True:
            due = clock() + interval
            await asyncio.sleep(interval)
            self.loop_lag.observe(max(clock() - due, 0.0))

    def live(self, read: Callable[[], dict[str, float]]) -> None:
        """Install the scrape-time gauges (once)."""
        if self._live is None:
            self._live = _LiveGauges(read)
            self.registry.register(self._live)

    def rpc(self, method: str, outcome: str) -> None:
        """Count one RPC request; unknown method names collapse into one label value."""
        self.requests.labels(method if method in self._known() else "_unknown", outcome).inc()

    def observe_request(self, row: TelemetryRow) -> None:
        """One recorded model request (a :class:`~relay_jupyter.core.telemetry.Telemetry` observer)."""
        source = row.source if row.source in _SOURCES else "proxy"
        self.model_requests.labels(source, row.status).inc()
        self.model_latency.labels(source).observe(row.latency_ms / 1000.0)
        if row.ttft_ms is not None:
            self.model_ttft.labels(source).observe(row.ttft_ms / 1000.0)
        for kind in ("input", "output", "cache_read", "cache_write"):
            n = getattr(row, f"{kind}_tokens")
            if n:
                self.model_tokens.labels(source, kind).inc(n)
        if row.cost_usd:
            self.model_cost.labels(source).inc(row.cost_usd)

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)


class CountingAudit:
    """An ``AuditSink`` wrapper that counts every decision for the metrics, then delegates."""

    def __init__(self, inner: AuditSink, metrics: BrokerMetrics) -> None:
        self.inner = inner
        self._metrics = metrics

    def append(self, record: AuditRecord) -> AuditRecord:
        stored = self.inner.append(record)
        self._metrics.decisions.labels(record.decision, record.code or "").inc()
        return stored

    def tail(self, n: int = 100, *, origin: str | None = None,
             where: Callable[[AuditRecord], bool] | None = None) -> list[AuditRecord]:
        return self.inner.tail(n, origin=origin, where=where)

    def __getattr__(self, name: str):
        # sync(), close(), ... of the durable audit log pass through
        return getattr(self.inner, name)
