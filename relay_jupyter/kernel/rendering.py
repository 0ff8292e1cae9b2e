"""The one way model-controlled text reaches the browser as HTML (issue 11 item 1).

JupyterLab renders a live session's ``text/html`` and ``text/markdown`` outputs as *trusted*: no
sanitiser runs, and ``<img onerror>``, ``<svg onload>`` and ``javascript:`` links act in the Jupyter
origin (which can call the Contents API, open a terminal, answer its own permission requests). So
everything the model, an MCP server or a tool result controls -- answer text, tool and server names,
arguments, file names, heads, diffs, error messages, step lines, card contents -- goes through this
module, or is shown as plain text (``text/plain``, ipywidgets ``Label``/``Textarea``/button
descriptions, which are text nodes).

- :func:`markdown_html`: Markdown parsed by ``markdown-it-py`` (CommonMark, plus tables and
  strikethrough; raw HTML disabled, linkify off), then sanitised by ``nh3`` (ammonia) with
  :data:`TAGS` / :data:`ATTRIBUTES`; link schemes exactly ``http``, ``https``, ``mailto`` (relative URLs
  and fragments are dropped too); ``rel="noopener noreferrer"`` on every link. Images render as a link
  with their alt text (a remote image loads by itself: an exfiltration channel). Two well-kept
  libraries instead of the hand-written escaper this replaces: the escaper had to re-implement
  CommonMark's parsing to know what was code, and every mis-parse was a hole.
- :func:`text_html`: text shown literally (HTML-escaped, control and bidi characters made visible).
- :func:`code_html`: code shown literally in a ``<pre><code>`` block, bounded, with a note when cut.
- :func:`chrome_html`: a fragment the kernel composed itself (cards, tables, diff view), with every
  model string already passed through :func:`text_html` / :func:`esc`, sanitised again with a
  slightly wider allowlist (layout tags, a few style properties with no URL value): defence in depth
  against a forgotten escape.
- :func:`bundle`: ``{"text/html": ..., "text/plain": <the raw text>}`` for ``display``.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from typing import Any

from ..core.visible import INVISIBLE, visible

__all__ = ["ATTRIBUTES", "CHROME_TAGS", "SCHEMES", "TAGS", "bundle", "chrome_html", "code_html", "esc",
           "markdown_html", "text_html", "visible"]

TAGS = frozenset({
    "p", "em", "strong", "s", "code", "pre", "blockquote", "ul", "ol", "li",
    "h1", "h2", "h3", "h4", "h5", "h6", "hr", "br", "a",
    "table", "thead", "tbody", "tr", "th", "td",
})
"""Tags kept in rendered Markdown: what CommonMark (+ tables, strikethrough) produces, minus ``img``."""

ATTRIBUTES: dict[str, frozenset[str]] = {
    "a": frozenset({"href", "title", "target"}),
    "ol": frozenset({"start"}),
    "code": frozenset({"class"}),
}
"""Attributes kept per tag (``class`` on ``code`` only as ``language-<name>``; ``target`` only as ``_blank``, so
a card's link opens a new tab instead of replacing JupyterLab; ``rel`` is set by nh3)."""

SCHEMES = frozenset({"http", "https", "mailto"})
"""The only link schemes: no ``javascript:``, ``data:``, ``vbscript:``, ``file:``, relative or ``#`` links."""

CHROME_TAGS = TAGS | {"div", "span", "b", "i", "small", "details", "summary"}
"""Tags of the kernel's own widget markup (cards, tables, diff view)."""

_CHROME_ATTRIBUTES: dict[str, set[str]] = {
    **{tag: set(attrs) for tag, attrs in ATTRIBUTES.items()},
    "details": {"open"},
    "div": {"style", "class", "title"}, "span": {"style", "title"}, "pre": {"style"},
}
_CHROME_STYLE = {"background-color", "color", "max-height", "overflow", "margin", "padding", "display",
                 "width", "font-family", "font-size", "white-space", "text-overflow", "max-width", "min-width"}
"""Style properties the kernel's own markup uses; none takes a URL (no ``background``, no ``content``)."""

_LANG = re.compile(r"language-[A-Za-z0-9_+#.-]{1,40}")
_CHROME_CLASS = re.compile(r"relay-[a-z-]{1,30}")
_SAFE_HREF = re.compile(r"(?:https?://|mailto:)", re.IGNORECASE)
CODE_LIMIT = 100_000
"""Characters of code shown in full by default (a longer code block is cut, with a note saying so)."""


def _mark_html(match: re.Match[str]) -> str:
    return f"&lt;U+{ord(match.group()):04X}&gt;"


def esc(value: Any, *, newlines: bool = True) -> str:
    """Any value as HTML text (quotes included), invisible characters made visible."""
    return html.escape(visible(str(value), newlines=newlines), quote=True)


def _attribute_filter(tag: str, attr: str, value: str) -> str | None:
    if attr == "href":
        # nh3 already checks the scheme; this also refuses relative URLs and fragments, and
        # whitespace before the scheme, so only an absolute http(s)/mailto link is left
        return value if _SAFE_HREF.match(value) else None
    if attr == "target":  # a new tab (rel noopener noreferrer is always set); never a named window or frame
        return "_blank" if value == "_blank" else None
    if attr == "class":
        if tag == "code":
            return value if _LANG.fullmatch(value) else None
        return value if _CHROME_CLASS.fullmatch(value) else None
    if attr == "start":
        return value if value.isdigit() and len(value) <= 9 else None
    return value


@lru_cache(maxsize=2)
def _cleaner(chrome: bool) -> Any:
    import nh3

    if chrome:
        tags, attributes, styles = set(CHROME_TAGS), _CHROME_ATTRIBUTES, _CHROME_STYLE
    else:
        tags, attributes, styles = set(TAGS), {t: set(a) for t, a in ATTRIBUTES.items()}, None
    return nh3.Cleaner(tags=tags, attributes=attributes, attribute_filter=_attribute_filter,
                       url_schemes=set(SCHEMES), url_relative="deny", link_rel="noopener noreferrer",
                       strip_comments=True, clean_content_tags={"script", "style"},
                       filter_style_properties=styles, generic_attribute_prefixes=set())


def _render_image(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    # an image loads by itself (a remote image carries whatever its URL encodes to another host):
    # show it as a link with its alt text, which a person may choose to follow
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = str(token.attrGet("src") or "")
    return f'<a href="{html.escape(src, quote=True)}">[image] {html.escape(alt or "image", quote=True)}</a>'


@lru_cache(maxsize=1)
def _parser() -> Any:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.add_render_rule("image", _render_image)
    return md


def markdown_html(text: str) -> str:
    """Model Markdown as sanitised HTML (see the module docstring for what survives)."""
    rendered = _parser().render(visible(text, strict=False))
    # an entity (``&#x202e;``) decodes to the character after the first pass: mark what survived, as text
    return INVISIBLE.sub(_mark_html, str(_cleaner(False).clean(rendered)))


def text_html(text: str) -> str:
    """``text`` shown literally: one ``<div>`` keeping line breaks (no Markdown, no tags)."""
    return f'<div class="relay-text" style="white-space:pre-wrap">{esc(text)}</div>'


def code_html(code: str, limit: int = CODE_LIMIT) -> str:
    """``code`` exactly as given (escaped, invisible characters marked) in a code block; beyond
    ``limit`` characters it is cut with a note saying how much is not shown."""
    note = ""
    if len(code) > limit:
        note = (f"<p><b>⚠ only the first {limit:,} of {len(code):,} characters are shown; deny unless you "
                "have read the rest.</b></p>")
        code = code[:limit]
    return (f'<pre style="max-height:24em;overflow:auto;margin:0"><code>{esc(code)}</code></pre>{note}')


def chrome_html(fragment: str) -> str:
    """The kernel's own widget markup (model strings already escaped), sanitised again."""
    return str(_cleaner(True).clean(fragment))


def bundle(text: str, *, kind: str = "markdown") -> dict[str, str]:
    """A display bundle: ``text/html`` rendered as ``kind`` (``markdown``, ``text`` or ``code``) and
    ``text/plain`` = the raw text (invisible characters marked), for saved notebooks and terminals."""
    if kind == "markdown":
        rendered = markdown_html(text)
    elif kind == "code":
        rendered = code_html(text)
    else:
        rendered = text_html(text)
    return {"text/html": rendered, "text/plain": visible(text, strict=kind != "markdown")}
