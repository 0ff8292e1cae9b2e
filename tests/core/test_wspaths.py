"""Path rules: hostile relative paths are refused, never resolved."""

from __future__ import annotations

import os
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_jupyter.core.errors import WorkspaceRefusal
from relay_jupyter.core.wspaths import split_relpath

HOSTILE = [
    "..", "../x", "a/../../b", "a/..", "/etc/passwd", "~", "~/x", "~root/x", "a\x00b", "a\\b", "..\\x",
    "%2e%2e/x", "a/%2E%2E/b", "%2fetc", "x.", "x ", "dir./f", " x", "", ".", "./a", "a//b", "C:/x",
    "a" * 256, "/".join(["d"] * 40), "a\nb", "a\u202eb", "a\u200bb",
]


@pytest.mark.parametrize("path", HOSTILE, ids=[repr(p)[:30] for p in HOSTILE])
def test_hostile_paths_are_refused(path: str) -> None:
    with pytest.raises(WorkspaceRefusal) as exc:
        split_relpath(path)
    assert exc.value.code.value == "PATH_REFUSED"
    assert "refused" in exc.value.message


def test_plain_paths_pass() -> None:
    assert split_relpath("a/b.txt") == ("a", "b.txt")
    assert split_relpath(".hidden/x") == (".hidden", "x")
    assert split_relpath("dir/") == ("dir",)
    assert split_relpath("%41bc") == ("%41bc",)  # a literal name, never decoded


def test_non_string_is_refused() -> None:
    with pytest.raises(WorkspaceRefusal):
        split_relpath(None)  # type: ignore[arg-type]


@given(st.text(min_size=1, max_size=80))
def test_property_every_accepted_path_stays_inside(path: str) -> None:
    try:
        parts = split_relpath(path)
    except WorkspaceRefusal:
        return
    root = "/ws/root"
    joined = posixpath.normpath(posixpath.join(root, *parts))
    assert joined.startswith(root + "/")
    assert ".." not in parts and all(p and "/" not in p and "\x00" not in p for p in parts)
    assert os.path.commonpath([root, joined]) == root
