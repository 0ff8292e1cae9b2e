"""Attack: make a card read differently from what runs, with characters ``core/visible.py`` did not mark.

The card (and its text fallback, and the ``input()`` prompt) shows a request's tool name, server, arguments and
``run_code``'s code with control and bidi characters as ``<U+XXXX>``. Before this fix a handful of characters
outside that list still passed as they are, each invisible or reordering in the browser or a terminal:

- U+061C ARABIC LETTER MARK: a bidi mark (Trojan Source's third implicit mark, beside LRM/RLM, which were
  marked);
- U+2028 / U+2029 LINE / PARAGRAPH SEPARATOR: ``str.splitlines`` and JavaScript break lines there, Python's
  tokenizer does not, so a card could show a second line of code that is still a comment, or a name on two
  lines;
- U+180E, U+FFF9–U+FFFB (format characters that show as nothing), U+034F COMBINING GRAPHEME JOINER, and the
  Hangul fillers U+115F, U+1160, U+3164, U+FFA0 (letters that look like nothing: a tool argument or a name
  that reads as empty or as another).

Now each is marked in names, arguments and code (``strict``), as the zero-width characters were; prose
(``strict=False``) keeps them (right-to-left scripts and Korean text use some of them).
"""

from __future__ import annotations

from typing import Any

import pytest

from relay_jupyter.core.visible import visible
from relay_jupyter.kernel.widgets.consent_card import ConsentCard, card_text

CHARS = ["\u061c", "\u2028", "\u2029", "\u180e", "\ufff9", "\ufffa", "\ufffb", "\u034f", "\u115f", "\u1160",
         "\u3164", "\uffa0"]


def _card_html(card: ConsentCard) -> str:
    def walk(widget: Any) -> str:
        own = getattr(widget, "value", "") if type(widget).__name__ == "HTML" else ""
        return own + "".join(walk(c) for c in getattr(widget, "children", ()))
    return walk(card.widget)


@pytest.mark.asyncio
@pytest.mark.parametrize("char", CHARS, ids=[f"U+{ord(c):04X}" for c in CHARS])
async def test_the_card_shows_the_character_instead_of_obeying_it(char: str) -> None:
    mark = f"<U+{ord(char):04X}>"
    code = f"x = 1  # harmless{char}import os; os.remove('data.csv')"
    data = {"request_id": "p", "run_id": "r", "call_id": "c", "tool": "run_code", "server": f"kern{char}el",
            "tool_class": "write", "arguments": {"code": code, f"k{char}": f"v{char}"}, "reasons": ["runs code"],
            "preview": {}, "deadline": 0, "scopes": ["once"]}
    html = _card_html(ConsentCard(data))
    text = card_text(data)
    for shown in (html, text):
        assert char not in shown, (f"U+{ord(char):04X}", shown[:300])
        assert mark in shown or mark.replace("<", "&lt;").replace(">", "&gt;") in shown
    assert visible(f"a{char}b") == f"a{mark}b" and visible(f"a{char}b", newlines=False) == f"a{mark}b"


def test_prose_keeps_what_its_scripts_need() -> None:
    """Control: an answer's text (``strict=False``) keeps the marks and fillers that Arabic and Korean prose
    use, and ZWJ (emoji sequences) is never marked."""
    for prose in ("\u0645\u061c\u0627", "\u3164\uac00", "line\u2028next", "\U0001f468\u200d\U0001f469"):
        assert visible(prose, strict=False) == prose
    assert visible("\U0001f468\u200d\U0001f469") == "\U0001f468\u200d\U0001f469"
