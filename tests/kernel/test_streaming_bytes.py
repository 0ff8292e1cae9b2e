"""Output traffic stays linear: a long streamed answer costs a bounded multiple of its size on iopub.

Each finished block is sent once in its final form, as sanitised ``text/html`` *and* its ``text/plain``
fallback (about 2.1x the block), the growing block as bounded ``text/plain`` updates: 20,000 back-to-back
deltas stay below 3x, a model-paced answer (whose visible 1 s refresh resends the open block) below 4x.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

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
    print(f"20k deltas: {ratio:.2f}x")
    assert ratio <= 3.0, ratio
    outputs = [m for m in msgs if m["msg_type"] in ("display_data", "update_display_data")]
    # coalesced: far fewer output messages than deltas
    assert len(outputs) < len(deltas) / 10


def test_long_paragraph_without_breaks_stays_linear(kernel: Any, broker: FakeBroker) -> None:
    deltas = ["word "] * 20_000  # one 100 kB paragraph: the live tail is capped, so updates stay small
    broker.script([("texts", deltas)])
    reply, msgs = execute(kernel, "%%agent\none paragraph", timeout=120)
    assert reply["status"] == "ok"
    ratio = _iopub_bytes(msgs) / len("".join(deltas))
    print(f"one 100 kB paragraph: {ratio:.2f}x")
    assert ratio <= 3.0, ratio
    updates = [m for m in msgs if m["msg_type"] == "update_display_data"]
    assert len(updates) < len(deltas) / 10


# ---------------------------------------------------------------- realistic pace (the peer benchmark's shape)
MARKER = "Zyxwvut"
_WORDS = ("kernels", "run", "code", "for", "a", "notebook", "and", "send", "results", "back", "over",
          "messages", "while", "the", "frontend", "renders", "them", "as", "cells", "execute")


def _tokens(n: int, paragraph_words: int | None) -> list[str]:
    """``benchmarks/peers/fake.py``'s answer as deltas: one word per token, paragraphs of 60 words."""
    words = [MARKER] + [_WORDS[i % len(_WORDS)] for i in range(n - 1)]
    step = paragraph_words or n
    paragraphs = [" ".join(words[i:i + step]) + "." for i in range(0, n, step)]
    text = "\n\n".join(paragraphs) + "\n"
    out: list[str] = []
    i = 0
    while i < len(text):  # split after each run of whitespace, as the fake's token counter does
        j = i
        while j < len(text) and not text[j].isspace():
            j += 1
        while j < len(text) and text[j].isspace():
            j += 1
        out.append(text[i:j])
        i = j
    return out


def _output_bytes(msgs: list[dict[str, Any]]) -> int:
    # what benchmarks/peer_magics.py counts: each output message's content and metadata as JSON
    return sum(len(json.dumps(m["content"], ensure_ascii=False).encode()) + len(json.dumps(m["metadata"]).encode())
               for m in msgs if m["msg_type"] in ("display_data", "update_display_data", "stream"))


@pytest.mark.slow
@pytest.mark.parametrize("paragraph_words", [60, None], ids=["ten-paragraphs", "one-paragraph"])
def test_paced_answer_costs_at_most_4x(kernel: Any, broker: FakeBroker, paragraph_words: int | None) -> None:
    # 600 tokens at 100 tokens/s: a partial view goes out only after 1 s with nothing new shown (interim),
    # and a paragraph's last update is its rendering (text/markdown only, before the sanitised text/html:
    # 2.2x and 2.6x; before the coalescing: 6.5x and 14x)
    deltas = _tokens(600, paragraph_words)
    answer = "".join(deltas)
    broker.script([("paced", deltas, 100.0)])
    reply, msgs = execute(kernel, "%%agent\npaced answer", timeout=60)
    assert reply["status"] == "ok"
    ratio = _output_bytes(msgs) / len(answer.encode())
    print(f"paced {paragraph_words}: {ratio:.2f}x")
    assert ratio <= 4.0, ratio
    # every word reached the final outputs, once
    final: dict[str, str] = {}
    order: list[str] = []
    for m in msgs:
        if m["msg_type"] in ("display_data", "update_display_data"):
            key = (m["content"].get("transient") or {}).get("display_id") or m["header"]["msg_id"]
            if key not in final:
                order.append(key)
            final[key] = m["content"]["data"].get("text/plain", "")
    shown = " ".join(final[k] for k in order)
    assert shown.count(MARKER) == 1 and "▍" not in shown and "working" not in shown
    assert " ".join(answer.split()) in " ".join(shown.replace("✓", "\n").split())
