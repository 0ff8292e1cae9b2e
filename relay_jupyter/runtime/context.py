"""The context pipeline: what is sent to the model at each request, built from the stored history.

The stored history (a conversation) keeps every message in full, each tagged with its ``turn``
(one ``%%agent`` cell = one turn). :func:`prepare` shapes only the request:

- every message is reduced to ``{role, content}`` (bookkeeping keys stay in storage);
- every assistant ``tool_use`` is answered by a ``tool_result`` in the next user message, in the
  order the model asked; a result found elsewhere is moved there, a missing one is answered
  "outcome unknown"; a result whose call is not in the preceding assistant message (an orphan)
  is dropped;
- a call id repeated by a later assistant message (histories stored before ids were made unique
  at the turn driver, see ``call_ids``) is renamed in the request, with the result that follows
  it, so each call keeps its own answer;
- consecutive messages of one role are merged (the APIs want alternation);
- older tool results beyond a character budget are trimmed head-and-tail with a marker.

Untrusted material (attachments, tool results) is wrapped by :func:`untrusted` into labeled
user-role content: it never reaches the system prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "OUTCOME_UNKNOWN",
    "untrusted",
    "user_message",
    "tool_result_block",
    "prepare",
    "trim_middle",
]

#: Answer to a call that has an intent and no outcome (crash) or no recorded result at all.
OUTCOME_UNKNOWN = "outcome unknown; the action may have happened"

_OPEN = "<untrusted-data"
_CLOSE = "</untrusted-data>"


def _defang(text: str) -> str:
    """Stop embedded text from closing (or faking) our label: break the tag name apart."""
    return text.replace("</untrusted-data", "</untrusted_data").replace("<untrusted-data", "<untrusted_data")


def untrusted(label: str, text: str) -> str:
    """``text`` inside a labeled envelope the system prompt tells the model to treat as data.

    The label is ours (e.g. ``attachment: df.describe()``, ``tool result: ws__read``); anything in
    ``text`` that looks like our closing tag is defanged so the data cannot end the envelope early.
    """
    safe_label = _defang(label).replace('"', "'").replace("\n", " ")[:200]
    return f'{_OPEN} source="{safe_label}">\n{_defang(text)}\n{_CLOSE}'


def user_message(prompt: str, attachments: Sequence[dict[str, Any]] = (), *, turn: int | None = None) -> dict:
    """The user message of a turn: the prompt, then each attachment as labeled untrusted text.

    ``attachments`` items are ``{"label": str, "content": str}`` (DataFrame summaries, files, …).
    """
    blocks: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
    for att in attachments:
        blocks.append({"type": "text", "text": untrusted(f"attachment: {att.get('label', '')}",
                                                            str(att.get("content", "")))})
    msg: dict[str, Any] = {"role": "user", "content": blocks}
    if turn is not None:
        msg["turn"] = turn
    return msg


def tool_result_block(call_id: str, tool: str, content: str, is_error: bool) -> dict[str, Any]:
    """A ``tool_result`` whose text is labeled untrusted (a tool's output is data, not orders)."""
    return {"type": "tool_result", "tool_use_id": call_id, "is_error": bool(is_error),
            "content": untrusted(f"tool result: {tool}", content)}


def trim_middle(text: str, head: int, tail: int) -> str:
    """Keep ``head`` characters and ``tail`` characters with a marker between, if longer."""
    if len(text) <= head + tail:
        return text
    cut = len(text) - head - tail
    return f"{text[:head]}\n[… {cut} characters trimmed …]\n{text[len(text) - tail:]}" if tail else \
        f"{text[:head]}\n[… {cut} characters trimmed …]"


def _blocks(msg: dict[str, Any]) -> list[dict[str, Any]]:
    content = msg.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in (content or []) if isinstance(b, dict)]


def prepare(history: Sequence[dict[str, Any]], *, result_budget: int = 60_000, head: int = 2_000,
            tail: int = 1_000) -> list[dict[str, Any]]:
    """Request messages from ``history`` (which is not modified). See the module docstring.

    ``result_budget`` is how many characters of tool results, counted from the newest, are sent
    whole; older results are trimmed to ``head`` + ``tail`` characters.
    """
    # A copy of each block, not of the whole history (a deep copy cost O(history) per model step,
    # issue 18): this function only replaces top-level keys of a block (``id``, ``tool_use_id``,
    # ``content``), never mutates what they hold, and the backends build new request objects.
    msgs = [{"role": m.get("role"), "content": [dict(b) for b in _blocks(m)]} for m in history
            if m.get("role") in ("user", "assistant")]
    _rename_repeated_ids(msgs)
    # index every result by the call it answers (the first one wins)
    results: dict[str, dict[str, Any]] = {}
    for m in msgs:
        if m["role"] == "user":
            for b in m["content"]:
                if b.get("type") == "tool_result" and b.get("tool_use_id") not in results:
                    results[b["tool_use_id"]] = b
    out: list[dict[str, Any]] = []
    answered: set[str] = set()
    pending: list[str] = []  # calls of the last assistant message still to be answered
    for m in msgs:
        if m["role"] == "assistant":
            if pending:
                out.append({"role": "user", "content": _answers(pending, results, answered)})
                pending = []
            calls = [b["id"] for b in m["content"] if b.get("type") == "tool_use"]
            blocks = [b for b in m["content"] if b.get("type") in ("text", "tool_use")
                      and not (b.get("type") == "text" and not b.get("text"))]
            if not blocks:
                continue
            _append(out, {"role": "assistant", "content": blocks})
            pending = calls
            continue
        others = [b for b in m["content"] if b.get("type") != "tool_result"]
        content = _answers(pending, results, answered) if pending else []
        pending = []
        content += others
        if content:
            _append(out, {"role": "user", "content": content})
    if pending:
        _append(out, {"role": "user", "content": _answers(pending, results, answered)})
    _trim_results(out, result_budget, head, tail)
    return out


def _rename_repeated_ids(msgs: list[dict[str, Any]]) -> None:
    """Give a ``tool_use`` whose id an earlier assistant message used a new id, and rename the first
    result with the old id between it and the next assistant message. Deterministic, so the request
    prefix stays the same from one request to the next (prompt caching)."""
    seen: set[str] = set()
    renames: dict[str, str] = {}  # old id -> new id, for the results after the current assistant message
    for m in msgs:
        if m["role"] == "assistant":
            renames = {}
            for b in m["content"]:
                if b.get("type") != "tool_use" or not isinstance(b.get("id"), str):
                    continue
                old = b["id"]
                if old in seen:
                    n = 1
                    while f"{old}_r{n}" in seen:
                        n += 1
                    b["id"] = renames[old] = f"{old}_r{n}"
                seen.add(b["id"])
            continue
        for b in m["content"]:
            if b.get("type") == "tool_result" and b.get("tool_use_id") in renames:
                b["tool_use_id"] = renames.pop(b["tool_use_id"])


def _answers(calls: list[str], results: dict[str, dict[str, Any]], answered: set[str]) -> list[dict[str, Any]]:
    blocks = []
    for call_id in calls:
        if call_id in answered:
            continue
        answered.add(call_id)
        blocks.append(results.get(call_id) or {"type": "tool_result", "tool_use_id": call_id,
                                               "is_error": True, "content": OUTCOME_UNKNOWN})
    return blocks


def _append(out: list[dict[str, Any]], msg: dict[str, Any]) -> None:
    if out and out[-1]["role"] == msg["role"]:
        prev = out[-1]["content"]
        if msg["role"] == "user" and any(b.get("type") == "tool_result" for b in msg["content"]):
            # tool results must come first in a user message: keep them ahead of earlier text
            results = [b for b in msg["content"] if b.get("type") == "tool_result"]
            rest = [b for b in msg["content"] if b.get("type") != "tool_result"]
            out[-1]["content"] = [*results, *prev, *rest]
        else:
            prev.extend(msg["content"])
        return
    out.append(msg)


def _trim_results(msgs: list[dict[str, Any]], budget: int, head: int, tail: int) -> None:
    used = 0
    for m in reversed(msgs):
        if m["role"] != "user":
            continue
        for b in m["content"]:
            if b.get("type") != "tool_result" or not isinstance(b.get("content"), str):
                continue
            size = len(b["content"])
            if used + size <= budget:
                used += size
                continue
            b["content"] = trim_middle(b["content"], head, tail)
            used = budget  # once over budget, every older result is trimmed too
