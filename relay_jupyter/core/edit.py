"""Exact, all-or-nothing text edits (the rules of ``scratch_edit``).

* Every ``old_text`` is matched against the content as it was *before* the call, so a model never
  has to simulate its own earlier edits to write the next one.
* A match must be unique unless ``replace_all``; matches of different edits must not overlap.
  Anything ambiguous fails the whole call: a half-applied edit is the one outcome nobody can
  reason about.
* Exact match first; when an edit has no exact match, one line-aligned retry that ignores smart
  quotes, unicode dashes and trailing whitespace (models often retype a block with tidied
  punctuation).
* Line endings follow the file: the ``\\n`` in ``old_text`` / ``new_text`` are written as the
  file's own ending. A BOM and a missing final newline are preserved.
* The result is a unified diff computed from the edit windows (:func:`core.diff.unified_diff_spans`),
  never the new file.
* Bounds before work: the result's size is computed from the matches (``len(content) + sum of
  len(new) - len(old)``) before anything is joined, and a result over ``max_result_bytes`` (the
  caller's quota and per-call memory bound) is refused with ``QUOTA_EXCEEDED`` having allocated
  nothing but the match offsets. A ``replace_all`` that multiplies a file costs nothing to refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .diff import DiffResult, unified_diff_spans
from .errors import Code, WorkspaceRefusal
from .textfile import check_text, line_ending, to_ending

__all__ = ["Edit", "EditOutcome", "apply_edits", "normalize_line", "MAX_REPLACEMENTS", "MAX_FUZZY_LINES"]

_QUOTES = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u00ab": '"', "\u00bb": '"',
}
_DASHES = {c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d"}
_FOLD = str.maketrans({**_QUOTES, **_DASHES, "\ufeff": None})
_MAX_REPORTED = 5
#: Most replacements one call may make: the match offsets are the only thing held before the
#: size check, and this bounds them (~100 bytes each) whatever the file and needle.
MAX_REPLACEMENTS = 100_000
#: Longest file (in lines) the relaxed retry indexes: its per-line tables cost ~200 bytes a line
#: (217 MiB for 1M lines measured), so above this an edit matches exactly or not at all.
MAX_FUZZY_LINES = 100_000


@dataclass(frozen=True)
class Edit:
    """Replace ``old_text`` by ``new_text`` (every occurrence when ``replace_all``)."""

    old_text: str
    new_text: str
    replace_all: bool = False


@dataclass(frozen=True)
class EditOutcome:
    """The edited bytes and the diff that describes them."""

    content: bytes
    diff: DiffResult
    replacements: int
    """Total number of replaced occurrences."""
    fuzzy: tuple[int, ...] = field(default=())
    """Indexes of edits that matched only on the relaxed (quotes/dashes/whitespace) retry."""


def normalize_line(line: str) -> str:
    """A line as the relaxed retry compares it: smart quotes and dashes folded, trailing space cut."""
    return line.translate(_FOLD).rstrip()


def _line_no(content: bytes, offset: int) -> int:
    return content.count(b"\n", 0, offset) + 1


class _Lines:
    """The file split into lines on its own ending, with start offsets (built only for the retry)."""

    def __init__(self, content: bytes, eol: bytes) -> None:
        self.eol = eol
        parts = content.split(eol)
        self.starts: list[int] = []
        pos = 0
        for part in parts:
            self.starts.append(pos)
            pos += len(part) + len(eol)
        self.lengths = [len(p) for p in parts]
        self.norm = [normalize_line(p.decode("utf-8")) for p in parts]
        # ``a\n`` splits into ["a", ""]: the empty tail is not a line.
        if len(parts) > 1 and parts[-1] == b"":
            self.starts.pop()
            self.lengths.pop()
            self.norm.pop()
        self.size = len(content)
        self.index: dict[str, list[int]] = {}
        for i, n in enumerate(self.norm):
            self.index.setdefault(n, []).append(i)

    def find(self, want: list[str]) -> list[int]:
        """Every line index where ``want`` matches line-aligned (overlapping matches included)."""
        k = len(want)
        return [i for i in self.index.get(want[0], ()) if self.norm[i:i + k] == want]

    def span(self, i: int, k: int, through_eol: bool) -> tuple[int, int]:
        """Bytes of lines ``i .. i+k-1``; with ``through_eol`` the last line's ending is included."""
        start = self.starts[i]
        last = i + k - 1
        end = self.starts[last] + self.lengths[last]
        if through_eol:
            end = min(end + len(self.eol), self.size)
        return start, end


def _exact(content: bytes, needle: bytes, replace_all: bool, cap: int = MAX_REPLACEMENTS) -> list[int]:
    """Start offsets of ``needle``: every non-overlapping one (at most ``cap + 1``: the caller refuses
    more than ``cap``), or (unique mode) up to two, overlaps counted."""
    out: list[int] = []
    pos = content.find(needle)
    while pos >= 0:
        out.append(pos)
        if (not replace_all and len(out) > 1) or len(out) > cap:
            break
        pos = content.find(needle, pos + (len(needle) if replace_all else 1))
    return out


def apply_edits(content: bytes, edits: Sequence[Edit], *, path: str = "",
                max_result_bytes: int | None = None) -> EditOutcome:
    """Apply ``edits`` to ``content`` all-or-nothing and return the new bytes and their diff.

    Raises:
        WorkspaceRefusal: ``NOT_TEXT`` (not UTF-8, NUL bytes), ``EDIT_NO_MATCH``, ``EDIT_AMBIGUOUS``
            (several matches without ``replace_all``, or overlapping edits), ``INVALID_ARGUMENTS``
            (no edits, empty ``old_text``), ``QUOTA_EXCEEDED`` (the result would be larger than
            ``max_result_bytes``; decided before the result is built).
    """
    if not edits:
        raise WorkspaceRefusal(Code.INVALID_ARGUMENTS, "give at least one edit", data={"path": path})
    check_text(content, path=path)
    eol = line_ending(content)
    spans: list[tuple[int, int, bytes, int]] = []  # (start, end, replacement, edit index)
    fuzzy: list[int] = []
    lines: _Lines | None = None
    for n, edit in enumerate(edits):
        label = f"edit {n + 1}" if len(edits) > 1 else "the edit"
        if edit.old_text == "":
            raise WorkspaceRefusal(
                Code.INVALID_ARGUMENTS,
                f"{label}: old_text is empty; quote the text to replace (use scratch_write for a new file)",
                data={"path": path, "edit": n})
        old_b = to_ending(edit.old_text, eol)
        new_b = to_ending(edit.new_text, eol)
        found = _exact(content, old_b, edit.replace_all, MAX_REPLACEMENTS - len(spans))
        if len(found) > 1 and not edit.replace_all:
            raise _ambiguous(content, found, label, path, n)
        _check_count(len(spans) + len(found), path)
        if found:
            spans.extend((s, s + len(old_b), new_b, n) for s in found)
            continue
        # The relaxed, line-aligned retry.
        want_text = edit.old_text.replace("\r\n", "\n").replace("\r", "\n")
        through_eol = want_text.endswith("\n")
        want = [normalize_line(x) for x in (want_text[:-1] if through_eol else want_text).split("\n")]
        if lines is None:
            if content.count(eol) > MAX_FUZZY_LINES:
                raise WorkspaceRefusal(
                    Code.EDIT_NO_MATCH,
                    f"{label}: old_text was not found in {path or 'the file'} (the relaxed retry that ignores "
                    f"smart quotes and dashes is skipped for files over {MAX_FUZZY_LINES} lines); quote it exactly",
                    data={"path": path, "edit": n})
            lines = _Lines(content, eol)
        hits = lines.find(want)
        if not hits:
            raise WorkspaceRefusal(
                Code.EDIT_NO_MATCH,
                f"{label}: old_text was not found in {path or 'the file'} (also tried ignoring smart quotes, "
                "dashes and trailing whitespace); read the file again and quote it exactly",
                data={"path": path, "edit": n})
        if not edit.replace_all:
            if len(hits) > 1:
                raise _ambiguous(content, [lines.starts[i] for i in hits], label, path, n)
        else:
            kept: list[int] = []
            for i in hits:  # non-overlapping, left to right, like str.replace
                if not kept or i >= kept[-1] + len(want):
                    kept.append(i)
            hits = kept
        fuzzy.append(n)
        _check_count(len(spans) + len(hits), path)
        for i in hits:
            s, e = lines.span(i, len(want), through_eol)
            rep = new_b
            # A match that ends the file without a final newline keeps it missing.
            if through_eol and e == len(content) and not content.endswith(eol) and rep.endswith(eol):
                rep = rep[: -len(eol)]
            spans.append((s, e, rep, n))
    spans.sort(key=lambda t: (t[0], t[1]))
    for (s1, e1, _, n1), (s2, _e2, _, n2) in zip(spans, spans[1:]):
        if s2 < e1:
            which = f"edits {n1 + 1} and {n2 + 1}" if n1 != n2 else f"edit {n1 + 1}"
            raise WorkspaceRefusal(
                Code.EDIT_AMBIGUOUS,
                f"{which} overlap near line {_line_no(content, s2)}; merge them into one edit",
                data={"path": path, "line": _line_no(content, s2)})
    result_size = len(content) + sum(len(rep) - (e - s) for s, e, rep, _ in spans)
    if max_result_bytes is not None and result_size > max_result_bytes:
        raise WorkspaceRefusal(
            Code.QUOTA_EXCEEDED,
            f"the edit would make {path or 'the file'} {result_size} bytes ({len(spans)} replacement(s)); "
            f"the limit for this file is {max_result_bytes} bytes, so nothing was changed",
            data={"path": path, "size": result_size, "max": max_result_bytes, "replacements": len(spans)})
    # memoryview slices: the unchanged stretches are copied once, by the join, not twice.
    view = memoryview(content)
    pieces: list[bytes | memoryview] = []
    pos = 0
    for s, e, rep, _ in spans:
        pieces.append(view[pos:s])
        pieces.append(rep)
        pos = e
    pieces.append(view[pos:])
    new = b"".join(pieces)
    view.release()
    label_path = path or "file"
    diff = unified_diff_spans(
        content, new, [(s, e, len(rep)) for s, e, rep, _ in spans],
        old_label=f"a/{label_path}", new_label=f"b/{label_path}")
    return EditOutcome(new, diff, len(spans), tuple(fuzzy))


def _check_count(count: int, path: str) -> None:
    if count > MAX_REPLACEMENTS:
        raise WorkspaceRefusal(
            Code.QUOTA_EXCEEDED,
            f"the edit would make more than {MAX_REPLACEMENTS} replacements in {path or 'the file'}; "
            "nothing was changed (write the new content with scratch_write instead)",
            data={"path": path, "max_replacements": MAX_REPLACEMENTS})


def _ambiguous(content: bytes, found: list[int], label: str, path: str, n: int) -> WorkspaceRefusal:
    lines = [_line_no(content, s) for s in found[:_MAX_REPORTED]]
    return WorkspaceRefusal(
        Code.EDIT_AMBIGUOUS,
        f"{label}: old_text matches more than once (lines {', '.join(map(str, lines))}); include more "
        "surrounding text to make it unique, or set replace_all",
        data={"path": path, "edit": n, "lines": lines})
