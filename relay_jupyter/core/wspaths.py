"""Which relative paths the scratch tools accept (pure string rules; no filesystem access).

A path is refused, never "fixed up": ``..``, absolute paths, ``~``, NUL, backslashes, control
characters, percent-encoded dots or slashes, empty or ``.`` components, names with trailing dots
or spaces (Windows would silently drop them and make two names one file) and over-long names.
What passes is a tuple of plain names that the I/O layer opens one by one under the root with
``O_NOFOLLOW``; containment is then proven on the opened directories, not on this string.
"""

from __future__ import annotations

import unicodedata
from urllib.parse import unquote

from .errors import Code, WorkspaceRefusal

__all__ = ["MAX_NAME_BYTES", "MAX_PATH_BYTES", "MAX_DEPTH", "split_relpath", "check_name"]

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
MAX_DEPTH = 32


def _refuse(path: str, why: str) -> WorkspaceRefusal:
    shown = path if len(path) <= 120 else path[:117] + "..."
    return WorkspaceRefusal(Code.PATH_REFUSED, f"path {shown!r} refused: {why}", data={"reason": why})


def check_name(name: str, path: str = "") -> None:
    """Raise ``PATH_REFUSED`` unless ``name`` is one acceptable path component."""
    path = path or name
    if name in ("", "."):
        raise _refuse(path, "empty or '.' path components are not allowed")
    if name == "..":
        raise _refuse(path, "'..' is not allowed; paths are relative to the workspace")
    if name.startswith("~"):
        raise _refuse(path, "'~' is not expanded; use a plain relative path")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        raise _refuse(path, "control or invisible format characters are not allowed in names")
    if name != name.rstrip(". "):
        raise _refuse(path, "names may not end with a dot or a space")
    if name != name.lstrip(" "):
        raise _refuse(path, "names may not start with a space")
    decoded = unquote(name)
    if decoded != name and (decoded in (".", "..") or any(c in decoded for c in "/\\\x00")):
        raise _refuse(path, "percent-encoded dots or separators are not allowed")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise _refuse(path, f"a name is longer than {MAX_NAME_BYTES} bytes")


def split_relpath(path: object) -> tuple[str, ...]:
    """Validate a workspace-relative path and return its components.

    Raises:
        WorkspaceRefusal: ``PATH_REFUSED`` with a message saying which rule the path broke.
    """
    if not isinstance(path, str):
        raise _refuse(repr(path), "the path must be a string")
    if path == "":
        raise _refuse(path, "the path is empty")
    if "\x00" in path:
        raise _refuse(path.replace("\x00", "\\0"), "NUL bytes are not allowed")
    if "\\" in path:
        raise _refuse(path, "backslashes are not allowed; use '/'")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse(path, "the path is not valid unicode") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise _refuse(path, f"the path is longer than {MAX_PATH_BYTES} bytes")
    if path.startswith("/"):
        raise _refuse(path, "absolute paths are not allowed; give a path relative to the workspace")
    if len(path) >= 2 and path[1] == ":" and path[0].isalpha():
        raise _refuse(path, "drive-letter paths are not allowed")
    parts = path.split("/")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()  # one trailing slash names the same directory
    if len(parts) > MAX_DEPTH:
        raise _refuse(path, f"the path is nested deeper than {MAX_DEPTH} levels")
    for name in parts:
        check_name(name, path)
    return tuple(parts)
