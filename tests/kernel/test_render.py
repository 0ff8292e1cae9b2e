"""StreamView with a recording sink and a manual clock: bounded updates, blocks sent once, in order."""

from __future__ import annotations

from relay_jupyter.kernel.render import StreamView


class Recorder:
    def __init__(self) -> None:
        self.ops: list[tuple[str, str | None, str]] = []
        self.outputs: dict[str, str] = {}
        self.order: list[str] = []

    def show(self, markdown: str, display_id: str | None) -> None:
        key = display_id or f"anon-{len(self.order)}"
        self.ops.append(("show", display_id, markdown))
        self.outputs[key] = markdown
        self.order.append(key)

    def update(self, markdown: str, display_id: str) -> None:
        self.ops.append(("update", display_id, markdown))
        self.outputs[display_id] = markdown


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
    assert joined.index("First para.") < joined.index("Second &lt;b>para&lt;/b>.") < joined.index("[card]") \
        < joined.index("After the card.") < joined.index("✓ done")
    assert "⏳" not in joined  # no indicator left behind


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
