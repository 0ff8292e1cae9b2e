"""core.diff and core.edit against the real GNU diff -u and patch -p1 (a corpus and generated cases)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_jupyter.core.diff import EXACT_LIMIT, unified_diff, unified_diff_spans
from relay_jupyter.core.edit import Edit, apply_edits
from relay_jupyter.core.errors import WorkspaceRefusal

pytestmark = pytest.mark.skipif(shutil.which("diff") is None or shutil.which("patch") is None,
                                reason="GNU diff and patch are needed")


def gnu_diff(tmp: Path, old: bytes, new: bytes) -> bytes:
    (tmp / "old").write_bytes(old)
    (tmp / "new").write_bytes(new)
    return subprocess.run(["diff", "-u", "--label", "a/f.txt", "--label", "b/f.txt", str(tmp / "old"),
                           str(tmp / "new")], capture_output=True, check=False).stdout


def patch_applies(tmp: Path, old: bytes, diff: bytes, new: bytes) -> None:
    work = tmp / "p"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    (work / "f.txt").write_bytes(old)
    if diff:
        r = subprocess.run(["patch", "-p1", "-s", "--no-backup-if-mismatch"], input=diff, cwd=work,
                           capture_output=True, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
    assert (work / "f.txt").read_bytes() == new


NUMBERED = "".join(f"line {i}\n" for i in range(1, 41))

# (name, old bytes, edits)
CORPUS = [
    ("lf_simple", NUMBERED.encode(), [Edit("line 5\n", "line five\n")]),
    ("crlf", NUMBERED.replace("\n", "\r\n").encode(), [Edit("line 7\nline 8", "seven\neight\nand more")]),
    ("lone_cr", b"a\rb\rc\r", [Edit("b", "B")]),
    ("empty_to_text", b"", None),
    ("no_trailing_newline", b"one\ntwo\nthree", [Edit("three", "THREE")]),
    ("add_trailing_newline_kept_missing", b"x\ny", [Edit("y", "y2\nz")]),
    ("bom", b"\xef\xbb\xbfimport os\nprint(1)\n", [Edit("print(1)", "print(2)")]),
    ("bom_first_line", b"\xef\xbb\xbfimport os\nprint(1)\n", [Edit("import os", "import sys")]),
    ("hunks_6_apart", NUMBERED.encode(), [Edit("line 10\n", "ten\n"), Edit("line 17\n", "seventeen\n")]),
    ("hunks_7_apart", NUMBERED.encode(), [Edit("line 10\n", "ten\n"), Edit("line 18\n", "eighteen\n")]),
    ("replace_all", b"k = 1\nx\nk = 2\ny\nk = 3\n" * 5, [Edit("k = ", "key = ", replace_all=True)]),
    ("delete_block", NUMBERED.encode(), [Edit("line 3\nline 4\n", "")]),
    ("insert_duplicate_line", b"a\n}\n}\nb\n", [Edit("}\nb", "}\n}\nb")]),
    ("at_start_and_end", NUMBERED.encode(), [Edit("line 1\n", "first\n"), Edit("line 40\n", "last\n")]),
    ("unicode", "héllo\nwörld\n✓ done\n".encode(), [Edit("wörld", "welt")]),
    ("to_empty", b"only\n", [Edit("only\n", "")]),
]


@pytest.mark.parametrize("name,old,edits", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus_matches_gnu_diff_and_patch(tmp_path: Path, name: str, old: bytes, edits) -> None:
    if edits is None:
        new = b"hello\nworld\n"
        result = unified_diff(old, new, old_label="a/f.txt", new_label="b/f.txt")
    else:
        out = apply_edits(old, edits, path="f.txt")
        new, result = out.content, out.diff
    assert result.text == gnu_diff(tmp_path, old, new)
    patch_applies(tmp_path, old, result.text, new)


def test_line_endings_bom_and_missing_newline_are_preserved() -> None:
    crlf = b"a\r\nb\r\nc\r\n"
    assert apply_edits(crlf, [Edit("b\nc", "B\nC")]).content == b"a\r\nB\r\nC\r\n"
    assert apply_edits(b"a\rb\r", [Edit("a\nb", "x\ny")]).content == b"x\ry\r"
    assert apply_edits(b"\xef\xbb\xbfa\nb", [Edit("b", "c")]).content == b"\xef\xbb\xbfa\nc"
    assert apply_edits(b"a\nb", [Edit("b\n", "c\n")]).content == b"a\nc"  # relaxed match at EOF


def test_hunk_grouping_and_first_line() -> None:
    out6 = apply_edits(NUMBERED.encode(), [Edit("line 10\n", "ten\n"), Edit("line 17\n", "x\n")])
    out7 = apply_edits(NUMBERED.encode(), [Edit("line 10\n", "ten\n"), Edit("line 18\n", "x\n")])
    assert (out6.diff.hunks, out7.diff.hunks) == (1, 2)
    assert out6.diff.first_changed_line == 10


def test_matching_rules() -> None:
    text = b"alpha\nbeta\nalpha\n"
    with pytest.raises(WorkspaceRefusal) as exc:
        apply_edits(text, [Edit("alpha", "x")])
    assert exc.value.code.value == "EDIT_AMBIGUOUS" and exc.value.data["lines"] == [1, 3]
    with pytest.raises(WorkspaceRefusal) as exc:
        apply_edits(text, [Edit("gamma", "x")])
    assert exc.value.code.value == "EDIT_NO_MATCH"
    with pytest.raises(WorkspaceRefusal) as exc:
        apply_edits(b"abcdef\n", [Edit("abcd", "x"), Edit("cdef", "y")])
    assert exc.value.code.value == "EDIT_AMBIGUOUS"
    # every old_text is matched against the original, not against the previous edit's result
    assert apply_edits(b"a b\n", [Edit("a", "b"), Edit("b", "c")]).content == b"b c\n"
    assert apply_edits(text, [Edit("alpha", "x", replace_all=True)]).content == b"x\nbeta\nx\n"
    with pytest.raises(WorkspaceRefusal) as exc:
        apply_edits(b"\xff\xfe bad\n", [Edit("bad", "good")])
    assert exc.value.code.value == "NOT_TEXT"
    with pytest.raises(WorkspaceRefusal) as exc:
        apply_edits(b"bin\x00ary\n", [Edit("bin", "x")])
    assert exc.value.code.value == "NOT_TEXT"
    with pytest.raises(WorkspaceRefusal) as exc:
        apply_edits(b"x\n", [Edit("", "y")])
    assert exc.value.code.value == "INVALID_ARGUMENTS"


def test_relaxed_retry_ignores_quotes_dashes_and_trailing_space() -> None:
    src = "msg = \u201chello\u201d  \nx = a \u2014 b\nend\n".encode()
    out = apply_edits(src, [Edit('msg = "hello"\nx = a - b', 'msg = "hi"\nx = 1')])
    assert out.content == b'msg = "hi"\nx = 1\nend\n'
    assert out.fuzzy == (0,)
    # the retry is line-aligned: a fragment inside a line does not match loosely
    with pytest.raises(WorkspaceRefusal):
        apply_edits(src, [Edit("a - b", "c")])


lines_st = st.lists(st.sampled_from(["a", "b", "c", "}", "", "  x", "y\r"]), min_size=0, max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=lines_st, new=lines_st, eol_old=st.booleans(), eol_new=st.booleans())
def test_property_whole_diff_is_gnu_and_applies(tmp_path: Path, old, new, eol_old, eol_new) -> None:
    a = "\n".join(old).encode() + (b"\n" if eol_old and old else b"")
    b = "\n".join(new).encode() + (b"\n" if eol_new and new else b"")
    d = unified_diff(a, b, old_label="a/f.txt", new_label="b/f.txt").text
    assert d == gnu_diff(tmp_path, a, b)
    patch_applies(tmp_path, a, d, b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.lists(st.sampled_from(["alpha", "beta", "gamma", "}", ""]), min_size=1, max_size=40),
       picks=st.lists(st.tuples(st.integers(0, 39), st.integers(1, 3), st.text("xyz\n", max_size=8)),
                      min_size=1, max_size=3))
def test_property_edit_diff_applies_and_failed_edit_changes_nothing(tmp_path: Path, old, picks) -> None:
    content = "\n".join(f"{w}{i % 7}" for i, w in enumerate(old)).encode() + b"\n"
    lines = content.decode().splitlines(keepends=True)
    edits = [Edit("".join(lines[i % len(lines):(i % len(lines)) + n]), rep) for i, n, rep in picks]
    before = bytes(content)
    try:
        out = apply_edits(content, edits, path="f.txt")
    except WorkspaceRefusal:
        assert content == before  # all-or-nothing: a refusal leaves the input untouched
        return
    patch_applies(tmp_path, content, out.diff.text, out.content)
    assert out.diff.text == gnu_diff(tmp_path, content, out.content)


def test_windowed_diff_on_a_large_file_is_gnu_identical(tmp_path: Path) -> None:
    old = "".join(f"row {i:06d} {'z' * 30}\n" for i in range(40_000)).encode()
    assert len(old) > EXACT_LIMIT
    edits = [Edit(f"row {i:06d} ", f"ROW {i:06d}\nnew line ") for i in (5, 20_000, 39_990)]
    out = apply_edits(old, edits, path="f.txt")
    assert out.diff.text == gnu_diff(tmp_path, old, out.content)
    many = apply_edits(old, [Edit("row 0012", "R0012", replace_all=True)], path="f.txt")
    assert many.replacements == 100  # 100 adjacent lines: one window, full analysis
    assert many.diff.text == gnu_diff(tmp_path, old, many.content)
    patch_applies(tmp_path, old, many.diff.text, many.content)
    sparse = apply_edits(old, [Edit("7 zzz", "7 Z", replace_all=True)], path="f.txt")
    assert sparse.replacements == 4000  # every tenth line: the dense single-line path
    assert sparse.diff.text == gnu_diff(tmp_path, old, sparse.content)


def test_spans_without_changes_give_an_empty_diff() -> None:
    assert unified_diff_spans(b"a\n", b"a\n", []).text == b""
    assert apply_edits(b"a\n", [Edit("a", "a")]).diff.text == b""
