"""StreamView with a recording sink and a manual clock: bounded updates, blocks sent once, in order."""

from __future__ import annotations

import html
import itertools
import re

from relay_jupyter.kernel.render import StreamView


def _shown(output: dict[str, str] | str) -> str:
    """What a person reads: the text/plain fallback, else the (escaped) live text/html as text."""
    if isinstance(output, str):
        return output
    if "text/plain" in output:
        return output["text/plain"]
    return html.unescape(re.sub(r"<[^>]*>", "", output.get("text/html", "")))


class Recorder:
    def __init__(self) -> None:
        self.ops: list[tuple[str, str | None, str]] = []
        self.raw: list[dict[str, str] | str] = []
        self.outputs: dict[str, str] = {}
        self.order: list[str] = []

    def show(self, output: dict[str, str] | str, display_id: str | None) -> None:
        key = display_id or f"anon-{len(self.order)}"
        self.ops.append(("show", display_id, _shown(output)))
        self.raw.append(output)
        self.outputs[key] = _shown(output)
        self.order.append(key)

    def update(self, output: dict[str, str], display_id: str) -> None:
        self.ops.append(("update", display_id, _shown(output)))
        self.raw.append(output)
        self.outputs[display_id] = _shown(output)


def test_updates_are_coalesced_by_time() -> None:
    now = [0.0]
    sink = Recorder()
    view = StreamView(sink, interval=0.1, clock=lambda: now[0], schedule=False)
    for i in range(10_000):
        view.text("word ")
        if i % 10 == 9:
            now[0] += 0.001  # 10,000 deltas over 1 s
    view.finish("done")
    # about 10 updates per simulated second plus the cap-driven block cuts, never one per delta
    assert len(sink.ops) < 200


def test_final_outputs_read_as_the_answer_in_order() -> None:
    now = [0.0]
    sink = Recorder()
    view = StreamView(sink, interval=0.1, clock=lambda: now[0], schedule=False)
    text = "First para.\n\nSecond <b>para</b>.\n\n```py\nx = 1\n```\n\nLast words"
    for ch in text:
        view.text(ch)
        now[0] += 0.02
    view.pause()
    sink.show("[card]", None)
    view.resume()
    view.text("After the card.")
    answer = view.finish("✓ done")
    assert answer == text + "After the card."
    final = [sink.outputs[k] for k in sink.order]
    joined = "\n".join(x for x in final if x)
    assert joined.index("First para.") < joined.index("Second <b>para</b>.") < joined.index("[card]") \
        < joined.index("After the card.") < joined.index("✓ done")
    assert "working…" not in joined  # no indicator left behind


def test_a_finished_block_is_sent_once() -> None:
    now = [0.0]
    sink = Recorder()
    view = StreamView(sink, interval=0.1, clock=lambda: now[0], schedule=False)
    for i in range(50):
        view.text(f"paragraph {i} unique-{i}.\n\n")
        now[0] += 0.05
    view.finish()
    for i in range(50):
        sent = sum(op[2].count(f"unique-{i}.") for op in sink.ops)
        assert sent == 1, (i, sent)


def _paced(view: StreamView, now: list[float], text: str, per_second: float) -> list[float]:
    """Feed ``text`` word by word at ``per_second``; return the clock at each output sent."""
    sent: list[float] = []
    sink = view.sink
    for word in text.split(" "):
        now[0] += 1 / per_second
        before = len(sink.ops)  # type: ignore[attr-defined]
        view.text(word + " ")
        view._maybe_flush()  # what the timer does in a kernel (schedule=False here)
        if len(sink.ops) > before:  # type: ignore[attr-defined]
            sent.append(now[0])
    return sent


def test_first_text_shows_at_once_and_text_shows_at_least_every_second() -> None:
    now = [10.0]
    sink = Recorder()
    view = StreamView(sink, interval=0.1, clock=lambda: now[0], schedule=False)
    view.resume()
    now[0] += 0.5  # the model's first token takes a while
    view.text("Hello ")
    assert sink.ops[-1][2].startswith("Hello")  # no waiting: the indicator was all there was
    sent = _paced(view, now, " ".join(["word"] * 1500), 45)  # a slow model, one long paragraph
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert max(gaps) <= 1.0 + 1 / 45 + 1e-9
    # and not much more often: a partial view is interim output (issue 18), one per refresh period
    assert min(gaps) >= 0.1 - 1e-9 and len(sent) <= 1500 / 45 / 1.0 + 20


def test_a_paragraph_finished_within_the_refresh_period_is_sent_once_as_its_final_form() -> None:
    now = [0.0]
    sink = Recorder()
    view = StreamView(sink, interval=0.1, clock=lambda: now[0], schedule=False)
    paragraph = " ".join(f"w{i}" for i in range(60)) + "."
    for _ in range(5):
        for word in (paragraph + "\n\n").split(" "):
            view.text(word + " ")
            now[0] += 0.01  # 0.6 s per paragraph: under the 1 s refresh period
            view._maybe_flush()
        now[0] += 0.2
        view._maybe_flush()
    view.finish()
    by_display: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for n, ((_, display_id, shown), raw) in enumerate(zip(sink.ops, sink.raw, strict=True)):
        by_display.setdefault(display_id or f"anonymous-{n}", []).append((shown, raw))
    finals = 0
    for i, shown in enumerate(by_display.values()):
        if paragraph not in shown[-1][0]:
            continue
        finals += 1
        text, raw = shown[-1]
        assert text.strip() == paragraph  # the last update is the final text, no cursor
        assert set(raw) == {"text/html", "text/plain"}  # the final form is complete: HTML and its fallback
        assert sum(paragraph in s for s, _ in shown) == 1  # the finished paragraph is sent once
        assert all("working" not in s for s, _ in shown)
        # no partial view of a paragraph that ended within the refresh period; the run's first text
        # replaces the indicator at once (one partial view, the first paragraph's)
        partials = shown[:-1]
        assert all(set(r) == {"text/plain"} for _, r in partials)
        assert len(partials) <= (1 if i == 0 else 0), (i, [s for s, _ in partials])
    assert finals == 5


def test_idle_indicator_after_a_quiet_paragraph_end() -> None:
    import asyncio

    async def main() -> Recorder:
        sink = Recorder()
        view = StreamView(sink, interval=0.01, idle=0.05)
        view.resume()
        view.text("A paragraph.\n\n")
        view.flush()
        async with asyncio.timeout(5):
            while not sink.ops or "working" not in sink.ops[-1][2]:
                await asyncio.sleep(0.01)
        view.text("More.")
        view.finish("done")
        return sink

    sink = asyncio.run(main())
    final = [sink.outputs[k] for k in sink.order]
    assert "working" not in "".join(final) and "More." in "".join(final)


def test_open_block_is_plain_text_and_a_finished_block_is_sanitised_html() -> None:
    now = [0.0]
    sink = Recorder()
    view = StreamView(sink, interval=0.1, clock=lambda: now[0], schedule=False)
    hostile = "[x](javascript:alert(1)) <img src=x onerror=alert(2)> **b**"
    for ch in hostile:
        view.text(ch)
        now[0] += 0.05
    live = [out for out in sink.raw if isinstance(out, dict) and out.get("text/plain", "").endswith("▍")]
    assert live and all(set(out) == {"text/plain"} for out in live)  # never HTML while it grows
    view.finish("done")
    (final,) = [out for out in sink.raw if isinstance(out, dict) and hostile in out.get("text/plain", "")
                and "text/html" in out]
    assert final["text/plain"] == hostile
    assert final["text/html"] == ("<p>[x](javascript:alert(1)) &lt;img src=x onerror=alert(2)&gt; "
                                  "<strong>b</strong></p>\n")


def test_the_first_text_replaces_the_indicator_at_once_even_within_the_interval() -> None:
    """Issue 18: a fresh kernel showed its indicator late (the renderer's first use) and the first text,
    arriving just after it, waited for the update interval counted from the indicator."""
    now = [10.0]
    sink = Recorder()
    view = StreamView(sink, interval=0.1, clock=lambda: now[0], schedule=False)
    view.resume()
    assert "working" in sink.ops[-1][2]
    now[0] += 0.01  # well inside the 0.1 s interval
    view.text("Hello ")
    assert sink.ops[-1][2].startswith("Hello")
    shown = len(sink.ops)
    now[0] += 0.01
    view.text("there ")  # the next partial update is rate-limited again
    assert len(sink.ops) == shown


def test_the_written_out_indicator_is_the_rendered_one() -> None:
    """The working indicator's HTML is written out (so a run's first output never builds the renderer);
    it must stay what the renderer makes of it."""
    from relay_jupyter.kernel.render import INDICATOR, INDICATOR_HTML, _own
    from relay_jupyter.kernel.rendering import markdown_html

    assert INDICATOR_HTML == markdown_html(INDICATOR)
    assert _own(INDICATOR) == {"text/html": markdown_html(INDICATOR), "text/plain": INDICATOR}
    assert _own("*calling a tool…*")["text/html"] == markdown_html("*calling a tool…*")
