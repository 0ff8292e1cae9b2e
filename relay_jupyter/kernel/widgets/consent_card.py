"""The consent card: one per write request (docs/gate.md §1, consent).

Shows the tool, server, class, arguments and reasons (for a tool whose arguments carry code, such as
``run_code``, the exact code; for a push the target, size, digest, redacted head and diff); buttons
Approve / Deny / Allow for this run / Always allow for this notebook -- only the scopes the broker
offers (``scopes`` in the request; ``run_code`` is approved one call at a time). After an answer the
buttons are disabled and the card says who answered and when, or that the request timed out or was
withdrawn. Every string from the request goes through :mod:`relay_jupyter.kernel.rendering`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from ..rendering import chrome_html, code_html, visible
from ..tools import MAX_CODE_CHARS
from .base import esc, html_widget, pretty_json, short, show, update
from .diff_view import DiffView

CODE_LIMIT = MAX_CODE_CHARS
"""The card shows code in full up to what ``run_code`` accepts (longer code is refused by the kernel)."""

__all__ = ["CHOICES", "CODE_LIMIT", "SCOPES", "ConsentCard", "answerer", "card_text", "code_of", "offered_choices",
           "verb"]

#: (button label, decision, scope, button style)
CHOICES = (
    ("Approve", "allow", "once", "success"),
    ("Deny", "deny", "once", "danger"),
    ("Allow for this run", "allow", "run", ""),
    ("Always allow for this notebook", "allow", "notebook", "warning"),
)
SCOPES = ("once", "run", "notebook")

_VERBS = {"allow": "Approved", "deny": "Denied", "timeout": "Timed out — denied",
          "cancelled": "Cancelled", "withdrawn": "Withdrawn"}


def offered_scopes(data: dict[str, Any]) -> tuple[str, ...]:
    """The answer scopes this request may be given: the broker's ``scopes`` (absent: all three).
    A malformed list offers only ``once`` (fail closed); ``once`` is always offered."""
    scopes = data.get("scopes")
    if scopes is None:
        return SCOPES
    if not isinstance(scopes, list):
        return ("once",)
    return tuple(s for s in SCOPES if s == "once" or s in scopes)


def offered_choices(data: dict[str, Any]) -> tuple[tuple[str, str, str, str], ...]:
    """The buttons of this card: Approve and Deny always, the wider scopes only when offered."""
    scopes = offered_scopes(data)
    return tuple(c for c in CHOICES if c[2] in scopes)


def code_of(data: dict[str, Any]) -> str | None:
    """The code a call would run (``run_code``'s ``code`` argument, or any tool's string ``code``)."""
    arguments = data.get("arguments")
    code = arguments.get("code") if isinstance(arguments, dict) else None
    return code if isinstance(code, str) else None


def _other_arguments(data: dict[str, Any]) -> Any:
    arguments = data.get("arguments", {})
    if code_of(data) is not None:
        return {k: v for k, v in arguments.items() if k != "code"}
    return arguments


TOOL_CHANGED = ("this tool changed since the run was offered it (description, schema or annotations): "
                "its pin and any earlier approval no longer apply")


def _tool_change_diff(data: dict[str, Any]) -> str | None:
    """The broker's diff of the tool as offered vs now ('' when it sent none), or None: not changed."""
    changed = data.get("tool_changed")
    if changed is None or changed is False:
        return None
    return str(changed.get("diff") or "") if isinstance(changed, dict) else ""


def reasons_beside_preview(data: dict[str, Any]) -> list[str]:
    """The request's reasons, less those the card's preview section shows itself (a push's size and digest,
    its head): the card said each of them twice, and a multi-line head ran into one line in a list item."""
    reasons = [str(r) for r in data.get("reasons") or []]
    preview = data.get("preview") if isinstance(data.get("preview"), dict) else {}
    if not preview:
        return reasons
    shown = []
    for reason in reasons:
        if "sha256" in preview and reason.startswith("size ") and str(preview.get("sha256")) in reason:
            continue
        if "head" in preview and reason.startswith("head ("):
            continue
        shown.append(reason)
    return shown


def _head_text(preview: dict[str, Any]) -> str:
    """A push's redacted head as lines (the broker sends a list of lines)."""
    head = preview.get("head")
    return "\n".join(str(line) for line in head) if isinstance(head, list) else str(head or "")


def _fact(key: str, value: Any) -> str:
    return f"{value:,} bytes" if key == "size" and isinstance(value, int) else str(value)


def answerer(answered_by: Any) -> str:
    """Who answered, in words, from a ``permission.resolved``'s ``answered_by`` (the broker's client id or
    mechanism): ``browser:<user>:<client>`` is the user in the side panel (the Jupyter user's name on a token
    server is a random id, which said nothing), ``kill:...`` the kill switch, ``scope:run`` / ``trust:notebook``
    an earlier wider approval."""
    text = str(answered_by or "")
    if text.startswith("browser:"):
        return "you in the side panel"
    if text.startswith("kill:"):
        return "the kill switch" + (" (side panel)" if text.startswith("kill:browser:") else "")
    if text.startswith("kernel:"):
        return "this notebook's kernel"
    known = {"scope:run": "your earlier “allow for this run”", "trust:notebook": "your saved “always allow”",
             "timeout": "the broker (timeout)", "shutdown": "the broker shutting down",
             "policy:no-consent-port": "the broker (nobody can be asked)"}
    if text in known:
        return known[text]
    return visible(short(text, 60), newlines=False) if text else "the broker"


def verb(decision: str) -> str:
    return _VERBS.get(decision, decision)


def _when(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def card_text(data: dict[str, Any], status: str = "waiting for your answer") -> str:
    """The text fallback of a card (also what a terminal prompt shows): control characters, terminal
    escapes and bidi overrides in the request are shown as ``<U+XXXX>``, not obeyed."""
    name = visible(str(data.get("tool")), newlines=False)
    server = visible(str(data.get("server") or "built-in"), newlines=False)
    lines = [(f"relay: permission request -- {name} "
              f"({visible(str(data.get('tool_class', 'write')), newlines=False)}, server: {server})")]
    code = code_of(data)
    if code is not None:
        lines.append(f"code ({len(code):,} characters):")
        lines.append(visible(code[:CODE_LIMIT]))
        if len(code) > CODE_LIMIT:
            lines.append(f"[only the first {CODE_LIMIT:,} of {len(code):,} characters are shown; the kernel "
                         f"refuses code longer than {MAX_CODE_CHARS:,} characters]")
        others = _other_arguments(data)
        if others:
            lines.append("other arguments: " + visible(short(pretty_json(others, 2000), 2000)))
    else:
        lines.append("arguments: " + visible(short(pretty_json(data.get("arguments", {}), 2000), 2000)))
    for reason in reasons_beside_preview(data):
        lines.append(f"  - {visible(short(reason, 300))}")
    changed = _tool_change_diff(data)
    if changed is not None:
        lines.append(f"WARNING: {TOOL_CHANGED}")
        if changed:
            lines.append(visible(short(changed, 4000)))
    preview = data.get("preview") or {}
    if preview:
        for key in ("target", "size", "sha256"):
            if key in preview:
                lines.append(f"{key}: {visible(_fact(key, preview[key]), newlines=False)}")
        if preview.get("head") and not preview.get("diff"):
            lines.append("head (secret-looking lines masked):")
            lines.append(visible(short(_head_text(preview), 4000)))
        if preview.get("diff"):
            lines.append(visible(short(str(preview["diff"]), 4000)))
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
        self.outcome: str | None = None
        preview = data.get("preview") or {}
        code = code_of(data)
        rows = [
            f"<b>Permission request</b> — <code>{esc(data.get('tool'), newlines=False)}</code>",
            (f"<div>class: <b>{esc(data.get('tool_class', 'write'), newlines=False)}</b> · server: "
             f"{esc(data.get('server') or 'built-in', newlines=False)} · run: "
             f"{esc(data.get('run_id') or '', newlines=False)}</div>"),
        ]
        if code is not None:
            rows.append(f"<div>code it would run ({len(code):,} characters, exactly as written):</div>"
                        + code_html(code, CODE_LIMIT))
            others = _other_arguments(data)
            if others:
                rows.append("<div>other arguments:</div><pre style='max-height:16em;overflow:auto;margin:0'>"
                            f"{esc(pretty_json(others))}</pre>")
        else:
            rows.append("<div>arguments:</div><pre style='max-height:16em;overflow:auto;margin:0'>"
                        f"{esc(pretty_json(data.get('arguments', {})))}</pre>")
        reasons = reasons_beside_preview(data)
        if reasons:
            rows.append("<ul>" + "".join(f"<li>{esc(short(r, 300))}</li>" for r in reasons) + "</ul>")
        changed = _tool_change_diff(data)
        if changed is not None:
            rows.append(f"<div><b>⚠ {esc(TOOL_CHANGED)}</b></div>")
        children: list[Any] = [html_widget("".join(rows))]
        if changed:
            children.append(DiffView(changed, "the tool as offered → as it is now").widget())
        if preview:
            facts = "".join(f"<div>{esc(k)}: <code>{esc(_fact(k, preview[k]), newlines=False)}</code></div>"
                            for k in ("target", "size", "sha256") if k in preview)
            if preview.get("head"):
                facts += ("<details><summary>head</summary><pre style='margin:0'>"
                          f"{esc(short(_head_text(preview), 4000))}</pre></details>")
            children.append(html_widget(facts))
            if preview.get("diff"):
                children.append(DiffView(str(preview["diff"]), "diff against the current file").widget())
        self.choices = offered_choices(data)
        self.buttons = []
        for label, decision, scope, style in self.choices:
            button = w.Button(description=label, button_style=style,
                              layout=w.Layout(width="auto"), tooltip=f"{decision} ({scope})")
            button.on_click(lambda _b, d=decision, s=scope: self._answer(d, s, "you (click)"))
            self.buttons.append(button)
        self.status = html_widget("<i>waiting for your answer…</i>")
        children += [w.HBox(self.buttons), self.status]
        self.widget = w.VBox(children, layout=w.Layout(border="1px solid #d0d7de", padding="6px", margin="4px 0"))
        self.widget.add_class("relay-card")  # the side panel's extension gives focus back after a click

    def show(self) -> None:
        """Display the card (widget + text fallback)."""
        show(self.widget, card_text(self.data), self.display_id)

    def _answer(self, decision: str, scope: str, who: str) -> None:
        # one answer per card: a second click (even in the same tick, before the future resolves) is ignored
        if self.answered or self.future.done():
            return
        if decision == "allow" and scope not in offered_scopes(self.data):
            scope = "once"  # never wider than offered, whatever a comm message claims
        self.answered = True
        self.mark(decision, scope, who, time.time())

        def resolve() -> None:
            if not self.future.done():
                self.future.set_result((decision, scope))

        # the click handler runs on the kernel's main thread today; resolving through the loop keeps it
        # correct if ipykernel ever delivers comm messages on a subshell thread
        self.loop.call_soon_threadsafe(resolve)

    def mark(self, decision: str, scope: str, who: str, when: float, note: str = "") -> None:
        """Disable the buttons and record the outcome on the card (and in its text fallback)."""
        for button in self.buttons:
            button.disabled = True
        self.outcome = decision
        reach = {"once": "", "run": " for this run", "notebook": " for this notebook (saved)"}.get(scope, "") \
            if decision == "allow" else ""
        if decision in ("timeout", "withdrawn"):
            line = f"{verb(decision)} at {_when(when)}"
        else:
            line = f"{verb(decision)}{reach} by {who} at {_when(when)}"
        line += f" — {note}" if note else ""
        self.status.value = chrome_html(f"<b>{esc(line)}</b>")
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
