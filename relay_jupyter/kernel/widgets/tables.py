"""The grants table (with revoke buttons), budget meters and the run view."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .base import esc, pretty_json, short, show

__all__ = ["BudgetMeters", "GrantsTable", "RunView", "budget_numbers"]


def _fmt_list(value: Any) -> str:
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(sorted(str(v) for v in value)) or "—"
    return str(value)


class GrantsTable:
    """One row per grant; Revoke calls ``revoke(origin)`` (``grants.revoke``) and marks the row."""

    def __init__(self, grants: list[dict[str, Any]], revoke: Callable[[str], Awaitable[Any]]) -> None:
        self.grants = grants
        self.revoke = revoke

    def text(self) -> str:
        if not self.grants:
            return "relay: no grants"
        lines = ["relay grants:"]
        for g in self.grants:
            lines.append(f"  {g.get('origin')}: tools [{_fmt_list(g.get('tools', []))}], "
                         f"models [{_fmt_list(g.get('models', []))}], budget {g.get('budget', {})}")
        return "\n".join(lines)

    def show(self) -> None:
        import ipywidgets as w

        rows: list[Any] = [w.HTML("<b>Grants</b>" if self.grants else "<i>no grants</i>")]
        for grant in self.grants:
            origin = str(grant.get("origin"))
            label = w.HTML(f"<code>{esc(origin)}</code> — tools: {esc(_fmt_list(grant.get('tools', [])))}; "
                           f"models: {esc(_fmt_list(grant.get('models', [])))}; "
                           f"budget: {esc(short(pretty_json(grant.get('budget', {}), 400), 400))}")
            button = w.Button(description="Revoke", button_style="danger", layout=w.Layout(width="auto"))
            note = w.HTML("")
            button.on_click(lambda b, o=origin, n=note: self._revoke(o, b, n))
            rows.append(w.HBox([button, label, note]))
        show(w.VBox(rows), self.text())

    def _revoke(self, origin: str, button: Any, note: Any) -> None:
        button.disabled = True

        async def go() -> None:
            try:
                await self.revoke(origin)
                note.value = f"<b>revoked at {time.strftime('%H:%M:%S')}</b>"
            except Exception as exc:  # noqa: BLE001 -- shown on the row: a click must never raise into the kernel
                note.value = f"<b style='color:#b00'>{esc(getattr(exc, 'message', str(exc)))}</b>"
                button.disabled = False

        asyncio.ensure_future(go())


def budget_numbers(info: dict[str, Any]) -> list[tuple[str, float, float | None, str]]:
    """(label, used, limit or None, unit) rows from a ``budget.get`` result (field names tolerated)."""
    if isinstance(info.get("usage"), dict):  # budget.get: {origin, usage: {tokens, cost_usd, limits, rpm, day}}
        info = info["usage"]
    limits = info.get("limits") or info.get("budget") or {}
    used_tokens = info.get("tokens", info.get("tokens_used", 0)) or 0
    used_cost = info.get("cost_usd", info.get("cost_used_usd", 0.0)) or 0.0
    rpm = info.get("rpm", info.get("requests_last_minute", 0)) or 0
    if isinstance(rpm, dict):
        rpm = rpm.get("used", rpm.get("count", 0)) or 0
    return [
        ("tokens today", float(used_tokens), limits.get("tokens_per_day"), "tokens"),
        ("estimated cost today", float(used_cost), limits.get("cost_per_day_usd"), "USD"),
        ("requests in the last minute", float(rpm), limits.get("requests_per_minute"), "req"),
    ]


class BudgetMeters:
    """Progress bars for tokens and estimated cost used against the limit, and requests per minute."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.rows = budget_numbers(info)

    def text(self) -> str:
        parts = []
        for label, used, limit, unit in self.rows:
            cap = "no limit" if limit is None else f"{limit:g}"
            parts.append(f"  {label}: {used:g} / {cap} {unit}")
        return "relay budget:\n" + "\n".join(parts)

    def show(self) -> None:
        import ipywidgets as w

        bars: list[Any] = [w.HTML("<b>Budget</b>")]
        for label, used, limit, unit in self.rows:
            top = float(limit) if limit else max(used, 1.0)
            style = "danger" if limit and used >= limit else ("warning" if limit and used >= 0.8 * limit else "success")
            bar = w.FloatProgress(value=min(used, top), min=0.0, max=top, bar_style=style,
                                  layout=w.Layout(width="240px"))
            cap = "no limit" if limit is None else f"{limit:g}"
            bars.append(w.HBox([w.HTML(f"<span style='display:inline-block;width:14em'>{esc(label)}</span>"), bar,
                                w.HTML(f"&nbsp;{used:g} / {esc(cap)} {esc(unit)}")]))
        show(w.VBox(bars), self.text())


class RunView:
    """A run's steps, tool calls, decisions and timings (from ``runs.get`` or the live events)."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.run = run

    def steps(self) -> list[dict[str, Any]]:
        return list(self.run.get("steps") or self.run.get("calls") or [])

    def text(self) -> str:
        head = (f"run {self.run.get('run_id', '?')}: {self.run.get('state', '?')} "
                f"model {self.run.get('model', '?')}")
        lines = [head]
        for step in self.steps():
            lines.append(f"  {step.get('tool', step.get('type', '?'))}: {step.get('decision', '')} "
                         f"{step.get('code') or ''} {step.get('duration_ms', '')} ms".rstrip())
        return "\n".join(lines)

    def html(self) -> str:
        rows = "".join(
            f"<tr><td>{esc(s.get('tool', s.get('type', '')))}</td><td>{esc(s.get('tool_class', ''))}</td>"
            f"<td>{esc(s.get('decision', ''))}</td><td>{esc(s.get('code') or '')}</td>"
            f"<td>{esc(s.get('duration_ms', ''))}</td>"
            f"<td><code>{esc(short(pretty_json(s.get('arguments', {}), 300), 300))}</code></td></tr>"
            for s in self.steps())
        return (f"<b>run {esc(self.run.get('run_id', ''))}</b> — {esc(self.run.get('state', ''))}, "
                f"model {esc(self.run.get('model', ''))}<table><tr><th>tool</th><th>class</th><th>decision</th>"
                f"<th>code</th><th>ms</th><th>arguments</th></tr>{rows}</table>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": self.html(), "text/plain": self.text()}
