"""Text-file facts the edit tool needs: is it text, which line ending, is there a BOM.

Everything works on the raw bytes, never on a decoded-and-re-encoded copy: decoding would drop a
UTF-8 BOM and ``str.splitlines`` would treat a lone CR, form feeds and U+2028 as line breaks, so
writing the result back would silently change bytes the edit never touched.
"""

from __future__ import annotations

import re

from .errors import Code, WorkspaceRefusal

__all__ = ["BOM", "check_text", "line_ending", "to_ending", "has_bom"]

BOM = b"\xef\xbb\xbf"
_ANY_NEWLINE = re.compile(r"\r\n|\r|\n")


def check_text(data: bytes, *, path: str = "") -> None:
    """Raise ``NOT_TEXT`` unless ``data`` is UTF-8 without NUL bytes (what GNU diff treats as text)."""
    where = f"{path}: " if path else ""
    if b"\x00" in data:
        raise WorkspaceRefusal(
            Code.NOT_TEXT, f"{where}the file contains NUL bytes, so it is binary; it cannot be edited as text",
            data={"path": path})
    if data.isascii():  # ASCII is UTF-8; this check is ~2x faster than decoding a large file
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkspaceRefusal(
            Code.NOT_TEXT,
            f"{where}the file is not UTF-8 (invalid byte at offset {exc.start}); convert it to UTF-8 "
            "first or replace it whole with scratch_write",
            data={"path": path, "offset": exc.start}) from None


def has_bom(data: bytes) -> bool:
    """True when ``data`` starts with a UTF-8 byte-order mark."""
    return data.startswith(BOM)


def line_ending(data: bytes) -> bytes:
    """The file's line ending: that of its first line break (``\\r\\n``, ``\\r`` or ``\\n``; ``\\n`` if none)."""
    nl = data.find(b"\n")
    # Only look for a CR before the first LF: a file without any CR must not be scanned twice.
    cr = data.find(b"\r", 0, nl + 1 if nl >= 0 else len(data))
    if nl < 0 and cr < 0:
        return b"\n"
    if nl < 0:
        return b"\r"
    if 0 <= cr < nl:
        return b"\r\n" if cr == nl - 1 else b"\r"
    return b"\n"


def to_ending(text: str, eol: bytes) -> bytes:
    """Encode ``text`` with every line break (``\\r\\n``, ``\\r``, ``\\n``) written as ``eol``."""
    return _ANY_NEWLINE.sub(eol.decode(), text).encode("utf-8")
