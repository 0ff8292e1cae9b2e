"""The consent card: one per write request (DESIGN.md §2 step 4).

Shows the tool, server, class, arguments and reasons (and for a push the target, size, digest,
redacted head and diff); buttons Approve / Deny / Allow for this run / Always allow for this
notebook. After an answer the buttons are disabled and the card says who answered and when.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from .base import esc, pretty_json, short, show, update
from .diff_view import DiffView

__all__ = ["CHOICES", "ConsentCard", "card_text"]

#: (button label, decision, scope, button style)
CHOICES = (
    ("Approve", "allow", "once", "success"),
    ("Deny", "deny", "once", "danger"),
    ("Allow for this run", "allow", "run", ""),
    ("Always allow for this notebook", "allow", "notebook", "warning"),
)


def _when(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def card_text(data: dict[str, Any], status: str = "waiting for your answer") -> str:
    """The text fallback of a card (also what a terminal prompt shows)."""
    lines = [(f"relay: permission request -- {data.get('tool')} "
              f"({data.get('tool_class', 'write')}, server: {data.get('server') or 'built-in'})")]
    lines.append("arguments: " + short(pretty_json(data.get("arguments", {}), 2000), 2000))
    for reason in data.get("reasons") or []:
        lines.append(f"  - {short(str(reason), 300)}")
    preview = data.get("preview") or {}
    if preview:
        for key in ("target", "size", "sha256"):
            if key in preview:
                lines.append(f"{key}: {preview[key]}")
        if preview.get("diff"):
            lines.append(short(str(preview["diff"]), 4000))
    lines.append(f"status: {status}")
    return "\n".join(lines)


class ConsentCard:
    """A displayed card whose answer is awaited with :meth:`wait`."""

    def __init__(self, data: dict[str, Any]) -> None:
        import ipywidgets as w

        self.data = data
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[tuple[str, str]] = self.loop.create_future()
        self.display_id = f"relay-card-{uuid.uuid4().hex}"
        self.answered = False
        preview = data.get("preview") or {}
        rows = [
            f"<b>🔐 Permission request</b> — <code>{esc(data.get('tool'))}</code>",
            (f"<div>class: <b>{esc(data.get('tool_class', 'write'))}</b> · server: "
             f"{esc(data.get('server') or 'built-in')} · run: {esc(data.get('run_id') or '')}</div>"),
            ("<div>arguments:</div><pre style='max-height:16em;overflow:auto;margin:0'>"
             f"{esc(pretty_json(data.get('arguments', {})))}</pre>"),
        ]
        reasons = data.get("reasons") or []
        if reasons:
            rows.append("<ul>" + "".join(f"<li>{esc(short(str(r), 300))}</li>" for r in reasons) + "</ul>")
        children: list[Any] = [w.HTML("".join(rows))]
        if preview:
            facts = "".join(f"<div>{esc(k)}: <code>{esc(preview[k])}</code></div>"
                            for k in ("target", "size", "sha256") if k in preview)
            if preview.get("head"):
                facts += ("<details><summary>head</summary><pre style='margin:0'>"
                          f"{esc(short(str(preview['head']), 4000))}</pre></details>")
            children.append(w.HTML(facts))
            if preview.get("diff"):
                children.append(DiffView(str(preview["diff"]), "diff against the current file").widget())
        self.buttons = []
        for label, decision, scope, style in CHOICES:
            button = w.Button(description=label, button_style=style,
                              layout=w.Layout(width="auto"), tooltip=f"{decision} ({scope})")
            button.on_click(lambda _b, d=decision, s=scope: self._answer(d, s, "you (click)"))
            self.buttons.append(button)
        self.status = w.HTML("<i>waiting for your answer…</i>")
        children += [w.HBox(self.buttons), self.status]
        self.widget = w.VBox(children, layout=w.Layout(border="1px solid #d0d7de", padding="6px", margin="4px 0"))

    def show(self) -> None:
        """Display the card (widget + text fallback)."""
        show(self.widget, card_text(self.data), self.display_id)

    def _answer(self, decision: str, scope: str, who: str) -> None:
        # one answer per card: a second click (even in the same tick, before the future resolves) is ignored
        if self.answered or self.future.done():
            return
        self.answered = True
        self.mark(decision, scope, who, time.time())

        def resolve() -> None:
            if not self.future.done():
                self.future.set_result((decision, scope))

        # the click handler runs on the kernel's main thread today; resolving through the loop keeps it
        # correct if ipykernel ever delivers comm messages on a subshell thread
        self.loop.call_soon_threadsafe(resolve)

    def mark(self, decision: str, scope: str, who: str, when: float, note: str = "") -> None:
        """Disable the buttons and record the answer on the card (and in its text fallback)."""
        for button in self.buttons:
            button.disabled = True
        verb = {"allow": "Approved", "deny": "Denied", "timeout": "Denied (timed out)",
                "cancelled": "Cancelled"}.get(decision, decision)
        reach = {"once": "", "run": " for this run", "notebook": " for this notebook (saved)"}.get(scope, "")
        line = f"{verb}{reach} by {who} at {_when(when)}" + (f" — {note}" if note else "")
        self.status.value = f"<b>{esc(line)}</b>"
        update(self.widget, card_text(self.data, line), self.display_id)

    async def wait(self, timeout: float) -> tuple[str, str]:
        """The (decision, scope) clicked; ``("timeout", "once")`` when ``timeout`` passes first."""
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                return await asyncio.shield(self.future)
        except TimeoutError:
            if not self.future.done():
                self.answered = True
                self.future.set_result(("timeout", "once"))
                self.mark("timeout", "once", "nobody", time.time(), f"no answer within {timeout:.0f} s")
            return self.future.result()
