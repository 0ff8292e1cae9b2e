"""The block segmenter (pure): each block once, in order, with a bounded live tail."""

from __future__ import annotations

import random

from relay_jupyter.kernel.segmenter import Segmenter


def test_segmenter_emits_each_block_once_and_reassembles() -> None:
    rng = random.Random(7)
    text = "".join(rng.choice(["word ", "word\n", "\n\n", "```py\n", "```\n", "x = 1\n"]) for _ in range(3000))
    seg = Segmenter(max_tail=300)
    blocks: list[str] = []
    pos = 0
    while pos < len(text):
        step = rng.randint(1, 40)
        blocks += seg.feed(text[pos:pos + step])
        assert len(seg.tail) <= 300 + 40 + 10  # bounded live tail
        pos += step
    blocks.append(seg.finish())
    # every non-blank character arrives exactly once, in order (fence close/reopen lines aside)
    flat = "".join("".join(b.split()) for b in blocks)
    assert flat.replace("```py", "").replace("```", "") == "".join(text.split()).replace("```py", "").replace("```", "")


def test_segmenter_cut_inside_fence_closes_and_reopens() -> None:
    seg = Segmenter(max_tail=60)
    out = seg.feed("```python\n" + "".join(f"line_{i} = {i}\n" for i in range(20)))
    assert out and all(block.startswith("```python") and block.endswith("```") for block in out)
