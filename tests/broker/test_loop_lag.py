"""The event-loop lag probe: ``relay_event_loop_lag_seconds`` in the broker's /metrics (issue 18)."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relay_jupyter.broker.metrics import BrokerMetrics


def _lag(metrics: BrokerMetrics) -> dict[str, float]:
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.name == "relay_event_loop_lag_seconds":
            return {s.labels.get("le", s.name): s.value for s in family.samples}
    raise AssertionError("relay_event_loop_lag_seconds is not in /metrics")


@pytest.mark.asyncio
async def test_a_blocked_loop_shows_in_the_lag_histogram():
    metrics = BrokerMetrics(set)
    metrics.start_loop_probe(interval=0.01)
    try:
        while _lag(metrics)["relay_event_loop_lag_seconds_count"] < 3:
            await asyncio.sleep(0.01)
        before = _lag(metrics)
        time.sleep(0.3)  # one callback holding the loop for 300 ms
        count = before["relay_event_loop_lag_seconds_count"]
        while _lag(metrics)["relay_event_loop_lag_seconds_count"] <= count:
            await asyncio.sleep(0.01)
        after = _lag(metrics)
    finally:
        metrics.stop_loop_probe()
    # the wake-up that followed the stall was at least 0.3 - 0.01 s late: above the 0.2 s bucket
    assert after["0.2"] - before["0.2"] < after["+Inf"] - before["+Inf"]
    assert after["relay_event_loop_lag_seconds_sum"] - before["relay_event_loop_lag_seconds_sum"] >= 0.25
    assert metrics._lag_task is None


@pytest.mark.asyncio
async def test_the_probe_starts_once_and_stops():
    metrics = BrokerMetrics(set)
    metrics.start_loop_probe()
    task = metrics._lag_task
    metrics.start_loop_probe()
    assert metrics._lag_task is task
    metrics.stop_loop_probe()
    await asyncio.sleep(0)
    assert task.cancelled() or task.done()
