"""A unified diff, coloured, with each hunk collapsible (``<details>``: no JavaScript needed)."""

from __future__ import annotations

from typing import Any

from ..rendering import chrome_html, visible
from .base import esc, html_widget, short

__all__ = ["DiffView", "split_hunks"]

MAX_DIFF_CHARS = 200_000
_COLOURS = {"+": "#e6ffec", "-": "#ffebe9", "@": "#ddf4ff"}


def split_hunks(diff: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(header lines, [(hunk header, hunk lines)]) of a unified diff."""
    header: list[str] = []
    hunks: list[tuple[str, list[str]]] = []
    for line in diff.splitlines():
        if line.startswith("@@"):
            hunks.append((line, []))
        elif hunks:
            hunks[-1][1].append(line)
        else:
            header.append(line)
    return header, hunks


def _line(line: str) -> str:
    key = line[:1] if not line.startswith(("+++", "---")) else ""
    colour = _COLOURS.get(key)
    style = f' style="background-color:{colour}"' if colour else ""
    return f"<span{style}>{esc(line) or ' '}</span>"


class DiffView:
    """Shows a diff as HTML (coloured lines, one ``<details>`` per hunk) with the raw diff as text/plain."""

    def __init__(self, diff: str, title: str = "", *, open_hunks: int = 3) -> None:
        self.diff = short(diff, MAX_DIFF_CHARS)
        self.title = title
        self.open_hunks = open_hunks

    def html(self) -> str:
        header, hunks = split_hunks(self.diff)
        parts = ['<div class="relay-diff" style="font-family:monospace;font-size:12px">']
        if self.title:
            parts.append(f"<b>{esc(self.title)}</b>")
        if header:
            parts.append('<pre style="margin:0">' + "\n".join(_line(h) for h in header) + "</pre>")
        if not hunks and not header:
            parts.append("<i>no changes</i>")
        for k, (head, lines) in enumerate(hunks):
            added = sum(1 for x in lines if x.startswith("+"))
            removed = sum(1 for x in lines if x.startswith("-"))
            opened = " open" if k < self.open_hunks else ""
            parts.append(f"<details{opened}><summary>{esc(head)} <small>+{added} −{removed}</small></summary>"
                         '<pre style="margin:0">' + "\n".join(_line(x) for x in lines) + "</pre></details>")
        parts.append("</div>")
        return "".join(parts)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": chrome_html(self.html()),
                "text/plain": visible((f"{self.title}\n" if self.title else "") + self.diff)}

    def widget(self) -> Any:
        """The same view as an ``ipywidgets.HTML`` (to embed in a card)."""
        return html_widget(self.html())
