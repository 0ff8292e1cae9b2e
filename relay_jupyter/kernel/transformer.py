"""Rewrite ``%%agent`` cells (and top-level ``%agent`` lines) into a top-level ``await``.

IPython turns an ``await`` at the top of a cell into an async run on the kernel's loop; from
ipykernel 7.4 the kernel keeps processing comm messages (widget clicks) while that cell waits, so
a consent card can be clicked while the run it belongs to is still streaming. A plain cell magic
would block the loop instead.

Registered in ``shell.input_transformers_cleanup``, which runs before IPython's own magic
handling, so the ``%%agent`` line never reaches the magic machinery in a kernel.
"""

from __future__ import annotations

import re

__all__ = ["agent_transformer", "rewrite"]

_CELL = re.compile(r"^%%agent(?:[ \t]+(.*))?$")
_LINE = re.compile(r"^%agent(?:[ \t]+(.*))?$")
_CALL = "await __import__('relay_jupyter.kernel.magics', fromlist=['run_cell_async']).run_cell_async"


def rewrite(source: str) -> str | None:
    """The rewritten cell, or None when it is not an agent cell."""
    lines = source.split("\n")
    first = 0
    while first < len(lines) and not lines[first].strip():
        first += 1
    if first == len(lines):
        return None
    head = lines[first].rstrip()
    match = _CELL.match(head)
    if match:
        body = "\n".join(lines[first + 1:])
        # repr() makes any prompt text a Python string literal: nothing in the prompt is ever executed
        return f"{_CALL}({(match.group(1) or '')!r}, {body!r})\n"
    if any(_LINE.match(line.rstrip()) for line in lines):
        out = []
        for line in lines:
            m = _LINE.match(line.rstrip())
            out.append(f"{_CALL}({(m.group(1) or '')!r})" if m else line)
        return "\n".join(out)
    return None


def agent_transformer(lines: list[str]) -> list[str]:
    """IPython cleanup transformer: ``lines`` (with line endings) -> rewritten lines."""
    source = "".join(lines)
    if "%agent" not in source:
        return lines  # the common case: one substring test, nothing else
    new = rewrite(source)
    if new is None:
        return lines
    return new.splitlines(keepends=True)
