"""Text a person reads, with what could hide or reorder it made visible (pure).

Server- and model-controlled text reaches people in two places: the notebook (through the kernel's
renderer, which escapes it for HTML after this) and a terminal (``jupyter relay tools list`` and the other
CLI listings print MCP servers' names, errors and hints). In both, a C0/C1 control character (a terminal
escape that recolours or moves the cursor, a carriage return that overwrites a line) or a bidi override
(Trojan Source) would let that text hide or rewrite what is shown, so each is shown as ``<U+XXXX>``.
Written here rather than taken from a library: it is one character class, and no well-kept library
offers exactly "mark, don't strip" for both outputs.
"""

from __future__ import annotations

import re

__all__ = ["visible", "INVISIBLE"]

# C0/C1 controls and the bidi overrides/isolates; ``strict`` (code, names, arguments) also marks
# zero-width and direction marks, which prose in right-to-left scripts may use (ZWJ/ZWNJ are never
# marked: emoji sequences and several scripts need them)
_CONTROL = "\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
INVISIBLE = re.compile(f"[{_CONTROL}]")
"""The controls and bidi overrides, for a caller that marks them its own way (the renderer: as HTML text)."""
# also, in ``strict``: ARABIC LETTER MARK (a bidi mark, like LRM/RLM), LINE/PARAGRAPH SEPARATOR (str.splitlines
# and JavaScript break there, Python's tokenizer does not: a card could show code on a line it is not on), format
# characters that show as nothing (U+180E, U+FFF9-FFFB), COMBINING GRAPHEME JOINER and the Hangul fillers, which
# look like nothing (red team, tests/attack/test_invisible_text.py)
_INVISIBLE_STRICT = re.compile(f"[{_CONTROL}\u200b\u200e\u200f\u2060-\u2064\ufeff"
                               "\u061c\u2028\u2029\u180e\ufff9-\ufffb\u034f\u115f\u1160\u3164\uffa0]")


def _mark(match: re.Match[str]) -> str:
    return f"<U+{ord(match.group()):04X}>"


def visible(text: str, *, strict: bool = True, newlines: bool = True) -> str:
    """``text`` with control and bidi-override characters as ``<U+XXXX>`` (a terminal escape or a
    right-to-left override cannot hide or reorder what a person reads); ``strict`` also marks zero-width
    characters; ``newlines=False`` also shows ``\\n`` / ``\\t`` (names are one line). CRLF and a lone CR
    count as a line break."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    out = (_INVISIBLE_STRICT if strict else INVISIBLE).sub(_mark, text)
    if not newlines:
        out = out.replace("\n", "<U+000A>").replace("\t", "<U+0009>")
    return out
