"""The connect card: the first use of the agent in a notebook asks what to grant it.

A click on Connect is the human consent behind ``grants.create {tools, models, budget}``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from ..rendering import chrome_html, visible
from .base import esc, html_widget, show, update

__all__ = ["ConnectCard", "connect_text"]


def connect_text(model: str, tools: list[str], budget: dict[str, Any], status: str) -> str:
    """Text fallback of the card."""
    return visible(f"relay: connect this notebook to the agent? model: {model}; tools: {', '.join(tools) or 'none'}; "
                   f"budget: {budget}; status: {status}")


class ConnectCard:
    """Model, tool checkboxes and budget fields; Connect / Cancel. :meth:`wait` returns the grant or None."""

    def __init__(self, model: str, tools: list[dict[str, Any]], budget: dict[str, Any], *,
                 checked: list[str] | None = None) -> None:
        """``checked``: the tools pre-checked (names, ``*`` for all; None: all), ``c.RelayApp.default_tools``."""
        import ipywidgets as w

        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[dict[str, Any] | None] = self.loop.create_future()
        self.display_id = f"relay-connect-{uuid.uuid4().hex}"
        self.answered = False
        # labels at their natural width: the default 90px cut "requests/min" to "requests/…"
        wide = {"description_width": "initial"}
        self.model_field = w.Text(value=model, description="model", style=wide)
        self.checks = []
        for tool in tools:
            klass = tool.get("class") or tool.get("tool_class") or "write"
            # a description is a text node (description_allow_html is off); invisible characters are shown
            pre = checked is None or "*" in checked or tool.get("name") in checked
            check = w.Checkbox(value=pre, description=visible(f"{tool.get('name')} ({klass})", newlines=False),
                               indent=False)
            check.tool_name = tool.get("name")
            self.checks.append(check)
        self.tokens = w.IntText(value=int(budget.get("tokens_per_day") or 200_000), description="tokens/day",
                                style=wide)
        self.cost = w.FloatText(value=float(budget.get("cost_per_day_usd") or 5.0), description="USD/day",
                                style=wide)
        self.rpm = w.FloatText(value=float(budget.get("requests_per_minute") or 30.0), description="requests/min",
                               style=wide)
        # a run's step cap (issue 13: a notebook shows a small budget stopping a run without a code cell)
        self.steps = w.IntText(value=int(budget.get("max_steps_per_run") or 25), description="steps/run",
                               style=wide)
        self.connect = w.Button(description="Connect", button_style="success")
        self.cancel = w.Button(description="Cancel")
        self.connect.on_click(lambda _b: self._answer(True))
        self.cancel.on_click(lambda _b: self._answer(False))
        self.status = html_widget("<i>Connect grants this notebook the model, tools and budget below. "
                             "Writes still ask you each time.</i>")
        tool_box = w.VBox(self.checks) if self.checks else html_widget("<i>no tools offered</i>")
        self.widget = w.VBox([html_widget("<b>Connect this notebook to the relay agent</b>"), self.model_field,
                              html_widget("tools:"), tool_box, self.tokens, self.cost, self.rpm, self.steps,
                              w.HBox([self.connect, self.cancel]), self.status],
                             layout=w.Layout(border="1px solid #d0d7de", padding="6px"))
        self.widget.add_class("relay-card")  # the side panel's extension gives focus back after a click
        self._text = connect_text(model, [c.tool_name for c in self.checks], budget, "waiting for your answer")

    def show(self) -> None:
        show(self.widget, self._text, self.display_id)

    def _answer(self, ok: bool) -> None:
        if self.answered or self.future.done():
            return  # one answer per card, even for two clicks in the same tick
        self.answered = True
        result = None
        if ok:
            result = {"tools": [c.tool_name for c in self.checks if c.value],
                      "models": [self.model_field.value.strip()] if self.model_field.value.strip() else [],
                      "budget": {"tokens_per_day": int(self.tokens.value), "cost_per_day_usd": float(self.cost.value),
                                 "requests_per_minute": float(self.rpm.value),
                                 "max_steps_per_run": int(self.steps.value)}}
        for widget in (self.connect, self.cancel, self.model_field, self.tokens, self.cost, self.rpm, self.steps,
                       *self.checks):
            widget.disabled = True
        line = f"{'Connected' if ok else 'Cancelled'} by you at {time.strftime('%H:%M:%S')}"
        self.status.value = chrome_html(f"<b>{esc(line)}</b>")
        update(self.widget, self._text.replace("waiting for your answer", line), self.display_id)
        self.loop.call_soon_threadsafe(lambda: self.future.done() or self.future.set_result(result))

    async def wait(self, timeout: float) -> dict[str, Any] | None:
        """The grant request, or None on Cancel or timeout."""
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(self.future)
        except TimeoutError:
            self._answer(False)
            return None
