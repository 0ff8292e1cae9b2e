"""The optional tool policy of the model endpoints (issue 16 item 3): a grant's ``proxy_tools`` names the
tools an answer relayed to its origin may call; a ``tool_use`` block (Anthropic) or a ``tool_calls`` entry
(OpenAI) for any other tool is replaced by a text saying relay refused it, in the JSON answer and in the
stream, and each refusal is audited (decision ``deny``, code ``SCOPE_EXCEEDED``, ``purpose: proxy_tool``).

Limits (docs/proxy.md): the client runs its own tools, so this only keeps an agent that uses relay as its
model endpoint from *being told* to call an ungranted tool; it cannot stop a client that ignores the answer,
nor server-side tools the model provider runs itself (``server_tool_use``), which the answer only reports.

Pure functions over parsed events (no I/O): each filter takes one event (or the whole answer) and returns
what to send instead, or None for "unchanged" (the original bytes then pass as they came).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

__all__ = ["AnthropicToolFilter", "OpenAIToolFilter", "ToolPolicy", "refused_text"]

_MAX_NAME = 200


def refused_text(name: str) -> str:
    """The text that stands in for a refused tool call."""
    return f"[relay refused the call to the tool {name[:_MAX_NAME]!r}: this notebook's grant does not allow it]"


class ToolPolicy:
    """The allowed names (``*``: all) and what to do with each refusal (``refused(name, call_id)``: audit)."""

    def __init__(self, allowed: frozenset[str], refused: Callable[[str, str | None], None]) -> None:
        self.allowed = allowed
        self._refused = refused

    def allows(self, name: Any) -> bool:
        return isinstance(name, str) and bool(name) and ("*" in self.allowed or name in self.allowed)

    def refuse(self, name: Any, call_id: Any) -> str:
        shown = name if isinstance(name, str) and name else "(no name)"
        self._refused(shown[:_MAX_NAME], call_id if isinstance(call_id, str) else None)
        return refused_text(shown)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class AnthropicToolFilter:
    """Messages API: a refused ``tool_use`` block becomes a text block (its ``input_json_delta``s are
    dropped, the refusal text arrives as a ``text_delta`` before its ``content_block_stop``); when every
    tool call of the answer was refused, ``stop_reason: tool_use`` becomes ``end_turn``."""

    def __init__(self, policy: ToolPolicy) -> None:
        self.policy = policy
        self._refused: dict[str, str] = {}  # block index -> refusal text
        self._any_refused = False
        self._kept = False

    def event(self, event: dict[str, Any]) -> list[dict[str, Any]] | None:
        kind = event.get("type")
        index = _key(event.get("index"))
        if kind == "content_block_start":
            block = event.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                if self.policy.allows(block.get("name")):
                    self._kept = True
                    return None
                self._refused[index] = self.policy.refuse(block.get("name"), block.get("id"))
                self._any_refused = True
                return [{"type": "content_block_start", "index": event.get("index"),
                         "content_block": {"type": "text", "text": ""}}]
        elif kind == "content_block_delta" and index in self._refused:
            return []
        elif kind == "content_block_stop" and index in self._refused:
            text = self._refused.pop(index)
            return [{"type": "content_block_delta", "index": event.get("index"),
                     "delta": {"type": "text_delta", "text": text}}, event]
        elif kind == "message_delta" and self._any_refused and not self._kept:
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
                changed = copy.deepcopy(event)
                changed["delta"]["stop_reason"] = "end_turn"
                return [changed]
        return None

    def message(self, message: dict[str, Any]) -> dict[str, Any] | None:
        content = message.get("content")
        if not isinstance(content, list):
            return None
        out, refused, kept = [], False, False
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                if self.policy.allows(block.get("name")):
                    kept = True
                else:
                    out.append({"type": "text", "text": self.policy.refuse(block.get("name"), block.get("id"))})
                    refused = True
                    continue
            out.append(block)
        if not refused:
            return None
        changed = dict(message, content=out)
        if not kept and changed.get("stop_reason") == "tool_use":
            changed["stop_reason"] = "end_turn"
        return changed


class OpenAIToolFilter:
    """Chat Completions: a refused ``tool_calls`` entry is removed (its later argument pieces too) and the
    refusal text added to the choice's ``content``; when every tool call of a choice was refused,
    ``finish_reason: tool_calls`` becomes ``stop``. A tool call whose first piece names no tool is refused
    (fail closed)."""

    def __init__(self, policy: ToolPolicy) -> None:
        self.policy = policy
        self._refused: set[str] = set()  # (choice, call index)
        self._known: set[str] = set()
        self._refused_in: set[str] = set()  # choices with a refused call
        self._kept_in: set[str] = set()

    def _calls(self, choice_key: str, part: dict[str, Any]) -> bool:
        calls = part.get("tool_calls")
        if not isinstance(calls, list):
            return False
        kept, texts, changed = [], [], False
        for position, call in enumerate(calls):
            if not isinstance(call, dict):
                changed = True
                continue
            # a streamed piece names its call by index; a whole answer's calls have none: their position
            key = _key([choice_key, call["index"] if "index" in call else f"#{position}"])
            if key in self._refused:
                changed = True
                continue
            if key not in self._known:
                fn = call.get("function")
                name = fn.get("name") if isinstance(fn, dict) else None
                if not self.policy.allows(name):
                    self._refused.add(key)
                    self._refused_in.add(choice_key)
                    texts.append(self.policy.refuse(name, call.get("id")))
                    changed = True
                    continue
                self._known.add(key)
                self._kept_in.add(choice_key)
            kept.append(call)
        if not changed:
            return False
        if kept:
            part["tool_calls"] = kept
        else:
            part.pop("tool_calls", None)
        if texts:
            part["content"] = (part.get("content") or "") + "".join(texts)
        return True

    def _choices(self, choices: Any, key: str) -> bool:
        changed = False
        if not isinstance(choices, list):
            return False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            choice_key = _key(choice.get("index"))
            part = choice.get(key)
            if isinstance(part, dict) and self._calls(choice_key, part):
                changed = True
            if (choice.get("finish_reason") == "tool_calls" and choice_key in self._refused_in
                    and choice_key not in self._kept_in):
                choice["finish_reason"] = "stop"
                changed = True
        return changed

    def event(self, event: dict[str, Any]) -> list[dict[str, Any]] | None:
        changed = copy.deepcopy(event)
        return [changed] if self._choices(changed.get("choices"), "delta") else None

    def message(self, answer: dict[str, Any]) -> dict[str, Any] | None:
        changed = copy.deepcopy(answer)
        return changed if self._choices(changed.get("choices"), "message") else None
