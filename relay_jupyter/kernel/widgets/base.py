"""Display helpers shared by the widgets: a widget view plus a text fallback in one output."""

from __future__ import annotations

import json
from typing import Any

from ..rendering import chrome_html, esc

__all__ = ["esc", "html_widget", "pretty_json", "short", "show", "update"]


def html_widget(fragment: str) -> Any:
    """An ``ipywidgets.HTML`` whose value is sanitised (:func:`~relay_jupyter.kernel.rendering.chrome_html`).

    The HTML widget sets ``innerHTML`` with no sanitiser, so this is the only way the widgets build
    one; every model- or tool-provided string inside ``fragment`` is already :func:`esc`-aped."""
    import ipywidgets as w

    return w.HTML(chrome_html(fragment))


def short(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with a visible marker."""
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def pretty_json(value: Any, limit: int = 4000) -> str:
    """Indented JSON for a card, bounded."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return short(text, limit)


def _bundle(widget: Any, text: str) -> dict[str, Any]:
    bundle: dict[str, Any] = {"text/plain": text}
    if widget is not None:
        bundle["application/vnd.jupyter.widget-view+json"] = {
            "version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    return bundle


def show(widget: Any, text: str, display_id: str | None = None) -> None:
    """Display ``widget`` with ``text`` as its text/plain fallback (saved notebooks, terminals)."""
    from IPython.display import display

    display(_bundle(widget, text), raw=True, display_id=display_id)


def update(widget: Any, text: str, display_id: str) -> None:
    """Replace a displayed widget output (same widget, new fallback text)."""
    from IPython.display import update_display

    update_display(_bundle(widget, text), raw=True, display_id=display_id)
