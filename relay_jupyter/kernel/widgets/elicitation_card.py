"""The elicitation card: an MCP server's question during a tool call, as a form in the cell (docs/mcp.md).

URL mode (``mode: "url"``): the card shows the server's message, the page's **host** and the link; relay never
opens it — the person clicks it (a new tab, ``noopener noreferrer``) and then "I opened it" (accept), Decline or
Cancel. Nothing typed on that page passes through relay.

Built from the ``elicitation.request`` event (its ``fields`` were checked and bounded by the broker):
a text box per string field, a number box per number, a checkbox per boolean, a dropdown per enum, a
multi-select per multi field, with the server's defaults filled in. The card says which server asks
during which tool call, and that the text is the server's, not relay's. Buttons: Submit (accept with the
values), Decline, Cancel. Nothing is submitted on its own: a timeout declines. Every string from the
request goes through :mod:`relay_jupyter.kernel.rendering`.

:func:`answer_elicitation` runs one request on a surface: ``widget`` shows the card and sends the answer
(an answer the broker refuses as not fitting the form re-opens the card with the reason); ``input`` and
``headless`` decline with one line (no form is typed into a terminal prompt; nbclient and papermill
cannot answer).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from ..rendering import chrome_html, visible
from .base import esc, html_widget, short, show, update

__all__ = ["ElicitationCard", "answer_elicitation", "elicitation_text", "refused_line"]

_VERBS = {"accept": "Submitted", "decline": "Declined", "cancel": "Cancelled", "timeout": "Timed out — declined"}


def _label(field: dict[str, Any]) -> str:
    name = visible(str(field.get("title") or field.get("name") or "?"), newlines=False)
    return name + (" *" if field.get("required") else "")


def elicitation_text(data: dict[str, Any], status: str = "waiting for your answer") -> str:
    """The text fallback of the card (terminal escapes and bidi overrides shown, not obeyed)."""
    server = visible(str(data.get("server") or "?"), newlines=False)
    tool = visible(str(data.get("tool") or "?"), newlines=False)
    lines = [f"relay: the MCP server {server} asks (during {tool}; the text below is the server's, not relay's):",
             visible(short(str(data.get("message") or ""), 2000))]
    if data.get("mode") == "url":
        host = visible(str(data.get("url_host") or "?"), newlines=False)
        lines.append(f"  it asks you to open a page on {host} (relay does not open it): "
                     f"{visible(str(data.get('url') or ''), newlines=False)}")
    for field in data.get("fields") or []:
        if isinstance(field, dict):
            kind = visible(str(field.get("kind")), newlines=False)
            desc = visible(short(str(field.get("description") or ""), 200), newlines=False)
            lines.append(f"  - {_label(field)} ({kind})" + (f": {desc}" if desc else ""))
    lines.append(f"status: {status}")
    return "\n".join(lines)


def refused_line(data: dict[str, Any]) -> str:
    """One line for a question relay declined without showing it (``elicitation.resolved`` with ``refused``)."""
    server = visible(str(data.get("server") or "?"), newlines=False)
    why = visible(short(str(data.get("refused") or ""), 300), newlines=False)
    return f"relay: declined a question from the MCP server {server} without showing it: {why}"


class ElicitationCard:
    """A displayed form; :meth:`wait` gives ``(action, content)``."""

    def __init__(self, data: dict[str, Any]) -> None:
        import ipywidgets as w

        self.data = data
        self.loop = asyncio.get_running_loop()
        self.display_id = f"relay-elicit-{uuid.uuid4().hex}"
        self.future: asyncio.Future[tuple[str, dict[str, Any] | None]] = self.loop.create_future()
        self.inputs: dict[str, tuple[dict[str, Any], Any]] = {}
        url_mode = data.get("mode") == "url" and isinstance(data.get("url"), str)
        rows = [
            (f"<b>{'🔗 The MCP server' if url_mode else 'Question from the MCP server'} "
             f"<code>{esc(data.get('server'), newlines=False)}</code>{' asks you to open a page' if url_mode else ''}"
             f"</b> — during <code>{esc(data.get('tool'), newlines=False)}</code>"),
            ("<div><i>The text and the link below come from that server, not from relay. relay does not open it: "
             "open it only if you expect this page; what you do there goes to that site, not through relay.</i></div>"
             if url_mode else
             "<div><i>The text and the form below come from that server, not from relay. Answer only what "
             "you would tell it; relay never fills this in for you.</i></div>"),
            f"<div style='white-space:pre-wrap;margin:4px 0'>{esc(short(str(data.get('message') or ''), 2000))}</div>",
        ]
        if url_mode:
            rows.append(f"<div>A page on <b>{esc(data.get('url_host') or '?', newlines=False)}</b>: "
                        f"<a href=\"{esc(data['url'])}\" target=\"_blank\">{esc(short(data['url'], 200), newlines=False)}</a>"
                        "</div>")
        children: list[Any] = [html_widget("".join(rows))]
        style = {"description_width": "initial"}
        for field in data.get("fields") or []:
            if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                continue
            kind, default = field.get("kind"), field.get("default")
            label = _label(field)
            if kind == "boolean":
                widget = w.Checkbox(value=bool(default), description=label, style=style, indent=False)
            elif kind == "integer":
                widget = w.IntText(value=int(default) if isinstance(default, (int, float)) else 0,
                                   description=label, style=style)
            elif kind == "number":
                widget = w.FloatText(value=float(default) if isinstance(default, (int, float)) else 0.0,
                                     description=label, style=style)
            elif kind == "enum":
                options = [(visible(str(lab), newlines=False), str(val)) for val, lab in field.get("options") or []]
                values = [v for _l, v in options]
                widget = w.Dropdown(options=options, value=default if default in values else None,
                                    description=label, style=style)
            elif kind == "multi":
                options = [(visible(str(lab), newlines=False), str(val)) for val, lab in field.get("options") or []]
                values = [v for _l, v in options]
                chosen = tuple(d for d in (default or []) if d in values)
                widget = w.SelectMultiple(options=options, value=chosen, description=label, style=style)
            else:
                widget = w.Text(value=default if isinstance(default, str) else "", description=label, style=style,
                                layout=w.Layout(width="90%"))
            self.inputs[field["name"]] = (field, widget)
            children.append(widget)
            if field.get("description"):
                children.append(html_widget(f"<div style='margin-left:1em;color:#57606a'>"
                                            f"{esc(short(str(field['description']), 500))}</div>"))
        self.buttons = []
        for label, action, look in (("I opened it" if url_mode else "Submit", "accept", "success"),
                                    ("Decline", "decline", "danger"), ("Cancel", "cancel", "")):
            button = w.Button(description=label, button_style=look, layout=w.Layout(width="auto"))
            button.on_click(lambda _b, a=action: self._answer(a))
            self.buttons.append(button)
        self.status = html_widget("<i>waiting for your answer…</i>")
        children += [w.HBox(self.buttons), self.status]
        self.widget = w.VBox(children, layout=w.Layout(border="1px solid #d4a72c", padding="6px", margin="4px 0"))
        self.widget.add_class("relay-card")  # the side panel's extension gives focus back after a click

    def show(self) -> None:
        show(self.widget, elicitation_text(self.data), self.display_id)

    def values(self) -> dict[str, Any]:
        """What the form holds now (empty text left out: a required one is then reported missing)."""
        out: dict[str, Any] = {}
        for name, (field, widget) in self.inputs.items():
            value = widget.value
            if field.get("kind") == "multi":
                value = list(value)
            if value is None or value == "":
                continue
            out[name] = value
        return out

    def _answer(self, action: str) -> None:
        if self.future.done():
            return
        content = self.values() if action == "accept" else None
        self.loop.call_soon_threadsafe(lambda: self.future.done() or self.future.set_result((action, content)))

    def reopen(self, reason: str) -> None:
        """The broker refused the values: say why and wait for another answer."""
        self.future = self.loop.create_future()
        for button in self.buttons:
            button.disabled = False
        self.status.value = chrome_html(f"<b>⚠ {esc(short(reason, 300))}</b>")

    def mark(self, action: str, who: str, when: float, note: str = "") -> None:
        for button in self.buttons:
            button.disabled = True
        for _field, widget in self.inputs.values():
            widget.disabled = True
        line = f"{_VERBS.get(action, action)} by {who} at {time.strftime('%H:%M:%S', time.localtime(when))}"
        line += f" — {note}" if note else ""
        self.status.value = chrome_html(f"<b>{esc(line)}</b>")
        update(self.widget, elicitation_text(self.data, line), self.display_id)

    async def wait(self, timeout: float) -> tuple[str, dict[str, Any] | None]:
        """``(action, content)`` clicked; ``("timeout", None)`` when ``timeout`` passes first."""
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                return await asyncio.shield(self.future)
        except TimeoutError:
            if not self.future.done():
                self.future.set_result(("timeout", None))
            return self.future.result()


def _remaining(data: dict[str, Any], limit: float) -> float:
    deadline = data.get("deadline")
    left = limit
    if isinstance(deadline, (int, float)):
        left = min(left, float(deadline) - time.time())
    return max(0.0, left)


async def _decline(client: Any, method: str, request_id: Any) -> None:
    """Send a decline; one the broker already ended (its own deadline) changes nothing, so it is quiet."""
    try:
        await client.call(method, {"request_id": request_id, "action": "decline"})
    except Exception:  # noqa: BLE001 - CONFLICT after the broker's deadline: the question is declined either way
        pass


async def answer_elicitation(data: dict[str, Any], surface: str, client: Any, *, timeout: float = 300.0,
                             method: str = "elicitation.answer", on_card: Any = None) -> str:
    """Run one ``elicitation.request`` on ``surface`` and send the answer; returns the action sent
    (``decline`` for a timeout). ``client.call(method, params)`` is the kernel's RPC client; an
    ``RpcError``-like exception with ``code == "INVALID_ARGUMENTS"`` re-opens the card."""
    request_id = data.get("request_id")
    if surface != "widget":
        print(refused_line({**data, "refused": "this kernel has no form to show it in (headless or terminal): "
                                                "declined"}), flush=True)
        await _decline(client, method, request_id)
        return "decline"
    card = ElicitationCard(data)
    card.show()
    if on_card is not None:
        on_card(card)
    while True:
        action, content = await card.wait(_remaining(data, timeout))
        if action == "timeout":
            card.mark("timeout", "nobody", time.time(), "no answer in time")
            await _decline(client, method, request_id)
            return "decline"
        params: dict[str, Any] = {"request_id": request_id, "action": action}
        if action == "accept":
            params["content"] = content or {}
        try:
            await client.call(method, params)
        except Exception as exc:  # noqa: BLE001 - the kernel's RpcError; anything else ends the card
            code = str(getattr(exc, "code", "") or getattr(exc, "data", {}).get("code", ""))
            message = str(getattr(exc, "message", exc))
            if "INVALID_ARGUMENTS" in code and action == "accept":
                card.reopen(message)
                continue
            card.mark(action, "you", time.time(), f"not accepted: {short(message, 200)}")
            return action
        card.mark(action, "you (click)", time.time())
        return action
