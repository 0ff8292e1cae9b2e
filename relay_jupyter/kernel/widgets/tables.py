"""The grants table (with revoke buttons), budget meters and the run view."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..rendering import chrome_html, visible
from .base import esc, html_widget, pretty_json, short, show

__all__ = ["BudgetMeters", "GrantsTable", "RunView", "budget_numbers", "budget_words", "frame", "local_time",
           "profile_budget_words"]

#: record fields that hold epoch seconds (audit ``ts``, runs ``started_at`` / ``finished_at``, grants, checkpoints)
TIME_COLUMNS = ("ts", "started_at", "finished_at", "created_at", "expires_at", "updated_at", "applied_at",
                "reverted_at", "intent_at", "outcome_at")


def _fmt_list(value: Any) -> str:
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(sorted(str(v) for v in value)) or "—"
    return str(value)


def local_time(value: Any) -> str:
    """Epoch seconds as a local date-time (``2026-12-01 15:02:11``); "" for a missing or odd value."""
    seconds = _number(value)
    if seconds is None or seconds <= 0:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def frame(records: list[dict[str, Any]]) -> Any:
    """A pandas DataFrame of broker records whose time columns are local date-times, not epoch floats
    (tz-aware ``datetime64``: they sort, filter and subtract as times, and print as the user's clock)."""
    import datetime

    import pandas as pd

    df = pd.DataFrame(records)
    zone = datetime.datetime.now().astimezone().tzinfo
    for column in TIME_COLUMNS:
        if column in df.columns:
            seconds = pd.to_numeric(df[column], errors="coerce")
            df[column] = pd.to_datetime(seconds, unit="s", utc=True).dt.tz_convert(zone).dt.floor("s")
    return df


_BUDGET_WORDS = (("tokens_per_day", "{:,.0f} tokens/day"), ("cost_per_day_usd", "${:,.2f}/day"),
                 ("requests_per_minute", "{:,.0f} requests/min"), ("max_steps_per_run", "{:,.0f} steps/run"),
                 ("max_tokens_per_run", "{:,.0f} tokens/run"))


def budget_words(budget: Any) -> str:
    """A grant's budget in words and numbers (``200,000 tokens/day · $5.00/day · 30 requests/min ...``),
    never raw JSON; a limit that is absent or None is left out, an unknown key is shown as ``key=value``."""
    if not isinstance(budget, dict):
        return "no limits" if budget in (None, {}) else str(budget)
    parts = []
    for key, form in _BUDGET_WORDS:
        value = _number(budget.get(key))
        if value is not None:
            parts.append(form.format(value))
    for key, value in sorted(budget.items()):
        if key not in dict(_BUDGET_WORDS) and value is not None:
            parts.append(f"{key}={value}")
    return " · ".join(parts) or "no limits"


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
            per_profile = profile_budget_words(g.get("profile_budgets"))
            lines.append(f"  {visible(str(g.get('origin')), newlines=False)}: tools [{_fmt_list(g.get('tools', []))}], "
                         f"models [{_fmt_list(g.get('models', []))}], budget: {budget_words(g.get('budget'))}"
                         + (f", profile budgets: {per_profile}" if per_profile else ""))
        return "\n".join(lines)

    def show(self) -> None:
        import ipywidgets as w

        rows: list[Any] = [html_widget("<b>Grants</b>" if self.grants else "<i>no grants</i>")]
        for grant in self.grants:
            origin = str(grant.get("origin"))
            # a long notebook path is cut with an ellipsis; the whole origin is its tooltip (title)
            label = html_widget(
                f"<div style='overflow:hidden;text-overflow:ellipsis;white-space:nowrap;max-width:60em' "
                f"title='{esc(origin, newlines=False)}'><code>{esc(origin, newlines=False)}</code></div>"
                f"<div>tools: {esc(_fmt_list(grant.get('tools', [])))}; "
                f"models: {esc(_fmt_list(grant.get('models', [])))}</div>"
                f"<div>budget: {esc(budget_words(grant.get('budget')))}</div>"
                + (f"<div>profile budgets: {esc(profile_budget_words(grant.get('profile_budgets')))}</div>"
                   if profile_budget_words(grant.get("profile_budgets")) else ""))
            # the button keeps its width (it was squeezed to "R…" by a long label beside it)
            button = w.Button(description="Revoke", button_style="danger", tooltip=f"revoke the grant of {origin}",
                              layout=w.Layout(width="auto", min_width="6em", flex="0 0 auto"))
            note = html_widget("")
            button.on_click(lambda b, o=origin, n=note: self._revoke(o, b, n))
            rows.append(w.HBox([button, label, note]))
        table = w.VBox(rows)
        table.add_class("relay-card")  # the side panel's extension gives focus back after a click
        show(table, self.text())

    def _revoke(self, origin: str, button: Any, note: Any) -> None:
        button.disabled = True

        async def go() -> None:
            try:
                await self.revoke(origin)
                note.value = chrome_html(f"<b>revoked at {time.strftime('%H:%M:%S')}</b>")
            except Exception as exc:  # noqa: BLE001 -- shown on the row: a click must never raise into the kernel
                note.value = chrome_html(f"<span style='color:#b00'><b>{esc(getattr(exc, 'message', str(exc)))}</b></span>")
                button.disabled = False

        asyncio.ensure_future(go())


def budget_numbers(info: dict[str, Any]) -> list[tuple[str, float | None, float | None, str]]:
    """(label, used or None when unknown, limit or None for no limit, unit) rows from a ``budget.get``
    result: ``{origin, usage}`` where ``usage`` is ``BudgetLedger.usage`` (``tokens``, ``cost_usd``,
    ``tokens_limit``, ``cost_limit``, ``rpm_limit``, ``rpm_available``, ...)."""
    usage = info.get("usage") if isinstance(info.get("usage"), dict) else info
    limit_rpm = _number(usage.get("rpm_limit"))
    available = _number(usage.get("rpm_available"))
    # the broker keeps a token bucket per origin: what is missing from a full bucket was used in the last minute
    used_rpm = max(0.0, float(round(limit_rpm - available))) if limit_rpm is not None and available is not None \
        else None
    return [
        ("tokens today", _number(usage.get("tokens")) or 0.0, _number(usage.get("tokens_limit")), "tokens"),
        ("estimated cost today", _number(usage.get("cost_usd")) or 0.0, _number(usage.get("cost_limit")), "USD"),
        ("requests in the last minute", used_rpm, limit_rpm, "req"),
        *_profile_rows(usage.get("profiles")),
        *_team_rows(usage.get("teams")),
    ]


def _profile_rows(profiles: Any) -> list[tuple[str, float | None, float | None, str]]:
    """The day limits of the profiles the grant caps (``Grant.profile_budgets``, budget.get's ``usage.profiles``):
    used (with what is in flight to that profile) against each limit it has. Read-only here: a profile's limit
    changes only with a fresh consent (``grants.create``)."""
    rows: list[tuple[str, float | None, float | None, str]] = []
    for row in profiles if isinstance(profiles, list) else []:
        if not isinstance(row, dict):
            continue
        name = visible(str(row.get("profile", "?")), newlines=False)
        rows += _limit_rows(row, f"profile {name}", "today")
    return rows


def profile_budget_words(limits: Any) -> str:
    """A grant's ``profile_budgets`` in words (``team: 50,000 tokens/day · $10.00/day``), "" when it has none."""
    parts = []
    for row in limits if isinstance(limits, list) else []:
        if isinstance(row, dict) and row.get("profile"):
            words = budget_words({k: row.get(k) for k in ("tokens_per_day", "cost_per_day_usd")})
            parts.append(f"{visible(str(row['profile']), newlines=False)}: {words}")
    return "; ".join(parts)


def _team_rows(teams: Any) -> list[tuple[str, float | None, float | None, str]]:
    """The rows of each team budget the notebook draws from (docs/multi-user.md): used (with what is in
    flight across the team) against each limit the team has, day and month."""
    rows: list[tuple[str, float | None, float | None, str]] = []
    for team in teams if isinstance(teams, list) else []:
        if not isinstance(team, dict):
            continue
        name = str(team.get("team", "?"))
        for period, when in (("day", "today"), ("month", "this month")):
            part = team.get(period) if isinstance(team.get(period), dict) else {}
            rows += _limit_rows(part, f"team {name}", when)
    return rows


def _limit_rows(part: dict[str, Any], label: str, when: str) -> list[tuple[str, float | None, float | None, str]]:
    """One row per limit ``part`` has (tokens, cost): used plus what is in flight against it, named
    ``"<label> tokens|cost <when>"`` (the profile and team budgets share the shape of budget.get's usage)."""
    rows: list[tuple[str, float | None, float | None, str]] = []
    for used, held, limit, unit, what in (("tokens", "reserved_tokens", "tokens_limit", "tokens", "tokens"),
                                          ("cost_usd", "reserved_cost_usd", "cost_limit", "USD", "cost")):
        cap = _number(part.get(limit))
        if cap is not None:
            spent = (_number(part.get(used)) or 0.0) + (_number(part.get(held)) or 0.0)
            rows.append((f"{label} {what} {when}", spent, cap, unit))
    return rows


def _number(value: Any) -> float | None:
    """A finite number or None (JSON has no infinity; a missing or odd value means unknown / no limit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _fmt_num(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


class BudgetMeters:
    """Progress bars for tokens and estimated cost used against the limit, and requests per minute."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.rows = budget_numbers(info)

    def text(self) -> str:
        parts = []
        for label, used, limit, unit in self.rows:
            cap = "no limit" if limit is None else f"{limit:g}"
            parts.append(f"  {label}: {_fmt_num(used)} / {cap} {unit}")
        return "relay budget:\n" + "\n".join(parts)

    def show(self) -> None:
        import ipywidgets as w

        bars: list[Any] = [html_widget("<b>Budget</b>")]
        for label, used, limit, unit in self.rows:
            value = used or 0.0
            top = float(limit) if limit else max(value, 1.0)
            style = "danger" if limit and value >= limit else ("warning" if limit and value >= 0.8 * limit
                                                                else "success")
            bar = w.FloatProgress(value=min(value, top), min=0.0, max=top, bar_style=style,
                                  layout=w.Layout(width="240px"))
            cap = "no limit" if limit is None else f"{limit:g}"
            bars.append(w.HBox([html_widget(f"<span style='display:inline-block;width:14em'>{esc(label)}</span>"), bar,
                                html_widget(f"&nbsp;{esc(_fmt_num(used))} / {esc(cap)} {esc(unit)}")]))
        show(w.VBox(bars), self.text())


class RunView:
    """A run's steps, tool calls, outcomes and timings, from ``runs.get``: ``{run_id, origin, conversation,
    state, started_at, finished_at, meta: {model, backend, mode, originator}, calls: [{call_id, tool,
    arguments, intent_at, outcome: {status, code, chars}, outcome_at}]}``."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.run = run

    def model(self) -> str:
        meta = self.run.get("meta") if isinstance(self.run.get("meta"), dict) else {}
        model = meta.get("model") or self.run.get("model")
        backend = meta.get("backend") or self.run.get("backend")
        name = str(model) if model else "the default model"
        return f"{name} ({backend})" if backend else name

    def summary(self) -> str:
        """Model steps and the time taken, e.g. ``2 model steps, started ..., took 1.2 s``."""
        meta = self.run.get("meta") if isinstance(self.run.get("meta"), dict) else {}
        steps = _number(meta.get("steps"))
        parts = [f"{steps:g} model step{'s' if steps != 1 else ''}"] if steps is not None else []
        if self.timing():
            parts.append(self.timing())
        return ", ".join(parts)

    def timing(self) -> str:
        started, finished = _number(self.run.get("started_at")), _number(self.run.get("finished_at"))
        if started is None:
            return ""
        text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        return f"started {text}, " + (f"took {finished - started:.1f} s" if finished is not None else "not finished")

    def steps(self) -> list[dict[str, Any]]:
        """One row per tool call: tool, status, code, duration (ms), arguments."""
        rows = []
        for call in self.run.get("calls") or self.run.get("steps") or []:
            if not isinstance(call, dict):
                continue
            outcome = call.get("outcome") if isinstance(call.get("outcome"), dict) else {}
            start, end = _number(call.get("intent_at")), _number(call.get("outcome_at"))
            duration = call.get("duration_ms")
            if duration is None and start is not None and end is not None:
                duration = round((end - start) * 1000, 1)
            rows.append({"tool": call.get("tool", call.get("type", "?")),
                         "status": outcome.get("status", call.get("decision", "pending")),
                         "code": outcome.get("code") or call.get("code") or "",
                         "duration_ms": "" if duration is None else duration,
                         "arguments": call.get("arguments", {})})
        return rows

    def text(self) -> str:
        head = f"run {self.run.get('run_id', '?')}: {self.run.get('state', '?')}, model {self.model()}"
        lines = [head + (f", {self.summary()}" if self.summary() else "")]
        for step in self.steps():
            ms = f" {step['duration_ms']} ms" if step["duration_ms"] != "" else ""
            lines.append(f"  {step['tool']}: {step['status']} {step['code']}".rstrip() + ms)
        return "\n".join(lines)

    def html(self) -> str:
        rows = "".join(
            f"<tr><td>{esc(s['tool'])}</td><td>{esc(s['status'])}</td><td>{esc(s['code'])}</td>"
            f"<td>{esc(s['duration_ms'])}</td>"
            f"<td><code>{esc(short(pretty_json(s['arguments'], 300), 300))}</code></td></tr>"
            for s in self.steps())
        return (f"<b>run {esc(self.run.get('run_id', ''))}</b> — {esc(self.run.get('state', ''))}, "
                f"model {esc(self.model())}{esc(', ' + self.summary()) if self.summary() else ''}"
                f"<table><tr><th>tool</th><th>status</th><th>code</th><th>ms</th><th>arguments</th></tr>"
                f"{rows}</table>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": chrome_html(self.html()), "text/plain": visible(self.text())}
