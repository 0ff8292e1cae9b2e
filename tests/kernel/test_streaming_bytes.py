"""Output traffic stays linear: a long streamed answer costs at most ~3x its size on iopub."""

from __future__ import annotations

import json
from typing import Any

from .conftest import execute
from .fake_broker import FakeBroker


def _answer(n_deltas: int) -> list[str]:
    words = ["alpha ", "beta ", "gamma ", "delta ", "`x<y` ", "**bold** ", "epsilon.\n"]
    deltas = []
    for i in range(n_deltas):
        deltas.append(words[i % len(words)])
        if i % 97 == 96:
            deltas.append("\n")  # a paragraph break now and then
    return deltas


def _iopub_bytes(msgs: list[dict[str, Any]]) -> int:
    # the wire size of each message's parts (header, parent, metadata, content) as JSON
    return sum(len(json.dumps(m["header"], default=str)) + len(json.dumps(m["parent_header"], default=str))
               + len(json.dumps(m["metadata"])) + len(json.dumps(m["content"])) for m in msgs
               if m["msg_type"] in ("display_data", "update_display_data", "stream"))


def test_iopub_bytes_per_answer_byte_at_most_3(kernel: Any, broker: FakeBroker) -> None:
    deltas = _answer(20_000)
    answer_bytes = len("".join(deltas).encode())
    broker.script([("texts", deltas)])
    reply, msgs = execute(kernel, "%%agent\nlong answer", timeout=120)
    assert reply["status"] == "ok"
    ratio = _iopub_bytes(msgs) / answer_bytes
    assert ratio <= 3.0, ratio
    outputs = [m for m in msgs if m["msg_type"] in ("display_data", "update_display_data")]
    # coalesced: far fewer output messages than deltas
    assert len(outputs) < len(deltas) / 10


def test_long_paragraph_without_breaks_stays_linear(kernel: Any, broker: FakeBroker) -> None:
    deltas = ["word "] * 20_000  # one 100 kB paragraph: the live tail is capped, so updates stay small
    broker.script([("texts", deltas)])
    reply, msgs = execute(kernel, "%%agent\none paragraph", timeout=120)
    assert reply["status"] == "ok"
    assert _iopub_bytes(msgs) / len("".join(deltas)) <= 3.0
    updates = [m for m in msgs if m["msg_type"] == "update_display_data"]
    assert len(updates) < len(deltas) / 10
