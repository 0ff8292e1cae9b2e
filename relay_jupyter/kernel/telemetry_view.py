"""``relay.telemetry()`` and ``relay.spend()`` (issue 16 item 5, docs/telemetry.md): the broker's
per-request telemetry rows of this notebook as a pandas DataFrame, and a matplotlib figure of spend and
tokens over time per model (or notebook, session, source).

The rows come from the ``telemetry.query`` RPC (the kernel imports no broker code). pandas and
matplotlib are imported only when these are called (``%load_ext`` stays light).
"""

from __future__ import annotations

import datetime
import math
from typing import Any

__all__ = ["COLUMNS", "GROUPS", "since_seconds", "spend_figure", "telemetry_frame"]

#: The columns of :func:`telemetry_frame`, in order (``core.telemetry.TelemetryRow``'s fields).
COLUMNS: tuple[str, ...] = ("id", "ts", "origin", "source", "model", "session", "lineage", "run_id", "profile",
                            "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                            "cost_usd", "estimated", "latency_ms", "ttft_ms", "status", "error_code")
#: What :func:`spend_figure` may group by (``notebook`` is the origin column).
GROUPS: dict[str, str] = {"model": "model", "notebook": "origin", "origin": "origin", "session": "session",
                          "source": "source", "status": "status"}
_TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def since_seconds(since: Any) -> float | None:
    """``since`` as UTC epoch seconds: None; a number (epoch seconds); a ``datetime`` (naive = local
    time) or pandas ``Timestamp``; a ``timedelta`` (that long ago).

    Raises:
        ValueError: anything else, or a time that is not finite.
    """
    if since is None:
        return None
    if isinstance(since, bool):
        raise ValueError("since: a time (datetime, timedelta ago, or epoch seconds), not a bool")
    if isinstance(since, int | float):
        value = float(since)
    elif isinstance(since, datetime.timedelta):
        value = datetime.datetime.now(datetime.timezone.utc).timestamp() - since.total_seconds()
    elif isinstance(since, datetime.datetime):  # pandas.Timestamp is one too
        value = (since if since.tzinfo is not None else since.astimezone()).timestamp()
    else:
        raise ValueError(f"since: a time (datetime, timedelta ago, or epoch seconds), not {type(since).__name__}")
    if not math.isfinite(value):
        raise ValueError("since: the time must be finite")
    return max(0.0, value)


def telemetry_frame(rows: list[dict[str, Any]]) -> Any:
    """A DataFrame of telemetry rows: one column per field (also when there are none), ``ts`` as a local
    date-time, ``tokens`` (all four kinds) added after the token columns."""
    import pandas as pd

    from .widgets.tables import frame

    df = frame([{c: r.get(c) for c in COLUMNS} for r in rows]) if rows else frame([])
    for column in COLUMNS:
        if column not in df.columns:
            df[column] = pd.Series(dtype="float64" if column in ("cost_usd", "latency_ms", "ttft_ms") else "object")
    df = df[list(COLUMNS)]
    tokens = sum((pd.to_numeric(df[c], errors="coerce").fillna(0) for c in _TOKENS),
                 start=pd.Series(0, index=df.index, dtype="int64"))
    df.insert(COLUMNS.index("cache_write_tokens") + 1, "tokens", tokens.astype("int64"))
    return df


def spend_figure(df: Any, *, by: str = "model", title: str | None = None) -> Any:
    """A matplotlib ``Figure`` (no pyplot: it is shown once, as the cell's result) with two panels over
    time: cumulative spend in USD and tokens per request, one line per ``by`` group.

    Raises:
        ValueError: ``by`` is not one of :data:`GROUPS`.
    """
    from matplotlib.figure import Figure

    column = GROUPS.get(by)
    if column is None:
        raise ValueError(f"by: one of {', '.join(sorted(GROUPS))}, not {by!r}")
    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax_cost, ax_tokens = fig.subplots(2, 1, sharex=True)
    fig.suptitle(title or f"relay spend per {by}")
    if df is None or len(df) == 0:
        for ax in (ax_cost, ax_tokens):
            ax.text(0.5, 0.5, "no model requests yet", ha="center", va="center", transform=ax.transAxes)
    else:
        data = df.assign(_group=df[column].fillna("(none)").astype(str)).sort_values("ts")
        cost = data.pivot_table(index="ts", columns="_group", values="cost_usd", aggfunc="sum").fillna(0.0)
        cost.cumsum().plot(ax=ax_cost, drawstyle="steps-post", marker=".")
        tokens = data.pivot_table(index="ts", columns="_group", values="tokens", aggfunc="sum")
        tokens.plot(ax=ax_tokens, style=".-")
        legend = ax_tokens.get_legend()
        if legend is not None:  # one legend, on the spend panel
            legend.remove()
    ax_cost.set_ylabel("spend (USD, cumulative)")
    ax_tokens.set_ylabel("tokens per request")
    ax_tokens.set_xlabel("time")
    for ax in (ax_cost, ax_tokens):
        ax.grid(True, alpha=0.3)
    return fig


def register_png_formatter(shell: Any) -> None:
    """Let IPython show a matplotlib ``Figure`` made without pyplot as a PNG (what the inline backend
    registers once pyplot is imported), unless a formatter is already registered."""
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", None)
    if not formatters or "image/png" not in formatters:
        return
    png = formatters["image/png"]
    try:
        from matplotlib.figure import Figure

        png.lookup_by_type(Figure)
        return
    except (KeyError, ImportError):
        pass

    def to_png(fig: Any) -> bytes:
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=96)
        return buf.getvalue()

    png.for_type_by_name("matplotlib.figure", "Figure", to_png)
