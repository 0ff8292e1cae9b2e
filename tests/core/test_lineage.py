"""core/lineage.py: sessions and lineage (continuation / compaction / undo / diverged), property tests
with hypothesis, and broker/sessions.py (state is stored only on commit, per origin, bounded)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from relay_jupyter.broker.sessions import SessionBook
from relay_jupyter.core.lineage import (
    Lineage,
    classify,
    fingerprint,
    message_digest,
    message_digests,
    resolve_session,
    session_from_headers,
)
from relay_jupyter.core.telemetry import LINEAGE_KINDS, safe_session_id

_text = st.text(alphabet="abcxyz é", min_size=0, max_size=6)
_block = st.builds(lambda t: {"type": "text", "text": t}, _text)
_content = st.one_of(_text, st.lists(_block, min_size=1, max_size=2))
message = st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "assistant"]), _content)
history = st.lists(message, min_size=1, max_size=12)


def d(msgs):
    return message_digests(msgs)


@given(history, st.lists(message, max_size=5))
def test_a_history_extended_is_a_continuation(h, extra) -> None:
    got = classify(d(h), d(h + extra))
    assert got == Lineage("continuation", kept=len(h), resume_at=len(h))


@given(st.lists(message, min_size=2, max_size=12), st.data())
def test_a_history_rolled_back_and_edited_is_an_undo_at_the_rollback_point(h, data) -> None:
    k = data.draw(st.integers(1, len(h) - 1))
    edited = data.draw(st.lists(message, max_size=4))
    incoming = h[:k] + edited
    assume(not edited or message_digest(edited[0]) != message_digest(h[k]))
    got = classify(d(h), d(incoming))
    assert got.kind == "undo" and got.kept == k


@given(st.lists(message, min_size=2, max_size=12), st.data())
def test_a_summarised_beginning_with_the_recent_messages_kept_is_a_compaction(h, data) -> None:
    s = data.draw(st.integers(2, len(h)))
    summary = {"role": "user", "content": "SUMMARY " + data.draw(_text)}
    extra = data.draw(st.lists(message, max_size=3))
    incoming = [summary] + h[len(h) - s:] + extra
    assume(message_digest(summary) != message_digest(h[0]))
    got = classify(d(h), d(incoming))
    assert got.kind == "compaction"
    kept = d(incoming)[: got.resume_at]
    assert kept[-2:] == d(h)[-2:]  # what it resumes after ends with the stored history's last messages


@given(history, st.lists(message, min_size=1, max_size=8))
def test_no_shared_message_is_diverged(h, other) -> None:
    assume(not set(d(h)) & set(d(other)))
    assert classify(d(h), d(other)).kind == "diverged"


@given(st.lists(message, max_size=8))
def test_nothing_stored_is_new(incoming) -> None:
    assert classify(None, d(incoming)) == Lineage("new") == classify((), d(incoming))


@settings(max_examples=300)
@given(st.lists(st.sampled_from([b"a" * 16, b"b" * 16, b"c" * 16]), max_size=8),
       st.lists(st.sampled_from([b"a" * 16, b"b" * 16, b"c" * 16]), max_size=8))
def test_classify_is_total_deterministic_and_consistent(stored, incoming) -> None:
    got = classify(stored, incoming)
    assert got.kind in LINEAGE_KINDS and got == classify(list(stored), tuple(incoming))
    is_prefix = bool(stored) and incoming[: len(stored)] == stored
    assert (got.kind == "continuation") == is_prefix
    if got.kind == "undo":
        assert 1 <= got.kept < len(stored) and incoming[: got.kept] == stored[: got.kept]
        assert got.kept == len(incoming) or incoming[got.kept] != stored[got.kept]
    if got.kind in ("compaction", "diverged"):
        assert stored and (not incoming or incoming[0] != stored[0])
    if got.kind == "compaction":
        assert 0 < got.resume_at <= len(incoming)


@given(_text, st.dictionaries(st.sampled_from(["type", "ephemeral"]), _text, max_size=1))
def test_digests_ignore_the_form_not_the_content(text, cache) -> None:
    plain = {"role": "user", "content": text}
    blocks = {"role": "user", "content": [{"type": "text", "text": text}]}
    marked = {"content": [{"text": text, "type": "text", "cache_control": cache or {"type": "ephemeral"}}],
              "role": "user"}
    assert message_digest(plain) == message_digest(blocks) == message_digest(marked)
    assert message_digest(plain) != message_digest({"role": "assistant", "content": text})
    assert message_digest(plain) != message_digest({"role": "user", "content": text + "!"})
    assert message_digest({**plain, "id": "x", "turn": 3}) == message_digest(plain)  # only role and content


@given(_text, history, st.lists(message, max_size=4))
def test_the_fingerprint_stays_while_a_conversation_goes_on(system, h, extra) -> None:
    assume(h[0]["role"] == "user")
    assert fingerprint(system, h) == fingerprint(system, h + extra) == fingerprint([{"type": "text",
                                                                                      "text": system}] if system
                                                                                     else system, h)
    assert fingerprint(system + "!", h) != fingerprint(system, h)
    changed = [{"role": "user", "content": "other " + str(h[0]["content"])}] + h[1:]
    assert fingerprint(system, changed) != fingerprint(system, h)
    assert safe_session_id(fingerprint(system, h))


def test_sessions_from_headers_are_safe_ids() -> None:
    assert session_from_headers({"X-Relay-Session": "abc-1"}) == "abc-1"
    assert session_from_headers({"x-claude-code-session-id": "6f1c2d3e-aaaa"}) == "6f1c2d3e-aaaa"
    assert session_from_headers({"x-relay-session": "mine", "x-claude-code-session-id": "cc"}) == "mine"
    hashed = session_from_headers({"x-relay-session": "my secret prompt text, please"})
    assert hashed is not None and hashed.startswith("sha256:") and "secret" not in hashed and safe_session_id(hashed)
    assert session_from_headers({"x-relay-session": "  "}) is None
    assert session_from_headers({"x-relay-session": "x" * 2000}) is None
    assert session_from_headers({}) is None
    msgs = [{"role": "user", "content": "hi"}]
    assert resolve_session({"x-relay-session": "s1"}, "sys", msgs) == ("s1", "header")
    sid, how = resolve_session({}, "sys", msgs)
    assert how == "fingerprint" and sid.startswith("fp:")


# ---- broker/sessions.py: the state -------------------------------------------------------------------

def _body(*texts: str, system: str = "sys") -> dict:
    roles = ["user", "assistant"]
    return {"system": system, "messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]}


def test_the_history_is_stored_only_on_commit() -> None:
    book = SessionBook()
    first = book.observe("notebook:a", {}, _body("q1"))
    assert first.lineage.kind == "new"
    failed = book.observe("notebook:a", {}, _body("q1", "a1", "q2"))
    assert failed.lineage.kind == "new"  # the first request never committed (it failed upstream)
    failed_again = book.observe("notebook:a", {}, _body("q1", "a1", "q2"))
    assert failed_again.lineage.kind == "new" and len(book) == 0
    failed_again.commit()
    failed_again.commit()  # once only
    nxt = book.observe("notebook:a", {}, _body("q1", "a1", "q2", "a2", "q3"))
    assert nxt.session == failed.session and nxt.lineage.kind == "continuation" and nxt.lineage.kept == 3
    nxt.commit()
    undo = book.observe("notebook:a", {}, _body("q1", "a1", "q2 edited"))
    assert undo.lineage == Lineage("undo", kept=2, resume_at=2)
    assert book.stored("notebook:a", nxt.session) == message_digests(_body("q1", "a1", "q2", "a2", "q3")["messages"])


def test_sessions_are_per_origin_and_bounded() -> None:
    book = SessionBook(max_sessions=2, max_messages=3)
    a = book.observe("notebook:a", {"x-relay-session": "s"}, _body("q1"))
    a.commit()
    b = book.observe("notebook:b", {"x-relay-session": "s"}, _body("q1", "a1", "q2"))
    assert b.lineage.kind == "new"  # the same session id in another notebook is another session
    b.commit()
    book.observe("notebook:c", {"x-relay-session": "s"}, _body("z")).commit()
    assert len(book) == 2 and book.stored("notebook:a", "s") is None  # least recently used forgotten
    long = book.observe("notebook:b", {"x-relay-session": "s"}, _body("q1", "a1", "q2", "a2", "q3"))
    assert long.lineage.kind == "continuation"
    long.commit()
    assert len(book.stored("notebook:b", "s") or ()) == 3


@pytest.mark.parametrize("body", [{}, {"messages": "nope"}, {"messages": [1, None, "x"]}, {"system": 5}])
def test_odd_bodies_get_a_lineage_not_an_exception(body) -> None:
    seen = SessionBook().observe("o", {}, body)
    assert seen.lineage.kind == "new" and safe_session_id(seen.session)
