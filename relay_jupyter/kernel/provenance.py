"""Provenance of each ``%%agent`` answer, saved in the notebook (issue 13 item 3; docs/provenance.md).

While a cell follows its run, :class:`ProvenanceRecorder` reads the same events the cell renders and
keeps what produced the answer: run id, conversation, backend, model, mode, tokens (input, output,
cache creation, cache read), cost, duration, outcome, and every tool call with its class, the
decision, who decided (the person's session, a reviewer model, the grant, the gate) and the
digests the consent card was bound to, plus the checkpoint ids of the files a run pushed. The cell's
footer line (``✓ done · 2.1 s · 1,234 tokens · $0.01 · `model` via backend · 2 tool calls · run ...``; the
backend is not repeated when it is the model's name)
reads the same in a saved notebook and in ``jupyter nbconvert --to html``, and its **output metadata**
carries the record under :data:`METADATA_KEY` (``{"relay": {"provenance": {...}}}``, schema
:data:`SCHEMA_VERSION`). The record rides on the footer's own output (no extra message: the cell's
output bytes stay within the bounds of ``render.py``).

Nothing secret and no tool arguments are kept: arguments never enter the record (the audit keeps
their redacted form, ``relay.audit()``); digests are SHA-256 of file contents the person saw on a card,
or of an MCP tool's definition. ``relay.provenance()`` reads the records back from the notebook file
(and the answers of this kernel not saved yet) as a pandas DataFrame.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..protocol.names import EventType

__all__ = ["METADATA_KEY", "SCHEMA_VERSION", "ProvenanceRecorder", "footer_suffix", "notebook_path",
           "read_notebook", "rows", "saved_records"]

METADATA_KEY = "relay"
"""Output-metadata key: ``output.metadata["relay"]["provenance"]`` is one record."""
SCHEMA_VERSION = 1
_DIGEST_KEYS = ("sha256", "workspace_sha256", "target_sha256", "source_sha256", "tool_digest")
_CALL_KEYS = ("call_id", "tool", "server", "class", "decision", "code", "decided_by", "scope", "is_error",
              "duration_ms")
_TOKEN_FIELDS = {"input_tokens": "input", "output_tokens": "output",
                 "cache_creation_input_tokens": "cache_creation", "cache_read_input_tokens": "cache_read"}


def _short(value: Any, limit: int = 200) -> str | None:
    return None if value is None else str(value)[:limit]


class ProvenanceRecorder:
    """Builds one run's record from its events (fed in order, each once)."""

    def __init__(self, run_id: str, *, conversation: str | None = None, chat: str | None = None,
                 cell_id: str | None = None, requested_model: str | None = None,
                 requested_backend: str | None = None, turn: int | None = None,
                 parent_cells: list[str | None] | None = None) -> None:
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.record: dict[str, Any] = {
            "version": SCHEMA_VERSION, "run_id": run_id, "conversation": conversation, "chat": chat,
            "cell_id": cell_id, "backend": requested_backend, "model": requested_model, "mode": None,
            "outcome": None, "code": None, "started_at": round(self.started_wall, 3), "duration_s": None,
            "tokens": {"input": 0, "output": 0, "cache_creation": 0, "cache_read": 0, "total": 0},
            "cost_usd": 0.0, "tool_calls": [], "checkpoints": [],
            # lineage by cell id: the conversation name the kernel sent, this answer's turn in it and the cells
            # of the turns before it (a restarted kernel rebuilds its chats from these: conversations.py)
            "lineage": {"conversation": _short(conversation, 100), "turn": turn,
                        "parent_cells": [_short(c, 100) for c in parent_cells or []]}}
        self.calls: dict[str, dict[str, Any]] = {}
        self.requests: dict[str, str] = {}  # permission request id -> call id

    def _call(self, call_id: str, tool: Any = None) -> dict[str, Any]:
        call = self.calls.get(call_id)
        if call is None:
            call = {"call_id": _short(call_id), "tool": _short(tool) or "?", "server": None, "class": None,
                    "decision": None, "code": None, "decided_by": None, "scope": None, "is_error": None,
                    "duration_ms": None, "digests": {}}
            self.calls[call_id] = call
            self.record["tool_calls"].append(call)
        elif tool and call["tool"] == "?":
            call["tool"] = _short(tool)
        return call

    def feed(self, kind: Any, data: dict[str, Any]) -> None:
        """One event of the run."""
        call_id = str(data.get("call_id") or "")
        if kind == EventType.RUN_STARTED:
            for key in ("conversation", "model", "backend", "mode"):
                if data.get(key):
                    self.record[key] = _short(data[key])
        elif kind == EventType.TURN:
            # the broker's lineage (it keys turns by cell id): which turn this answer took, the cells before it
            turn, parents = data.get("turn"), data.get("parent_cells")
            if isinstance(turn, int) and not isinstance(turn, bool) and turn >= 0 and isinstance(parents, list) \
                    and len(parents) == turn:
                lineage = self.record["lineage"]
                lineage["turn"] = turn
                lineage["parent_cells"] = [_short(c, 100) if isinstance(c, str) else None for c in parents]
        elif kind == EventType.USAGE:
            tokens = self.record["tokens"]
            for field, name in _TOKEN_FIELDS.items():
                try:
                    tokens[name] += max(0, int(data.get(field) or 0))
                except (TypeError, ValueError):
                    continue
            tokens["total"] = sum(tokens[name] for name in _TOKEN_FIELDS.values())
            try:
                self.record["cost_usd"] = round(self.record["cost_usd"] + float(data.get("cost_usd") or 0.0), 6)
            except (TypeError, ValueError):
                pass
        elif kind == EventType.TOOL_PROPOSED and call_id:
            self._call(call_id, data.get("tool"))  # arguments deliberately not kept
        elif kind == EventType.TOOL_VALIDATED and call_id:
            self._call(call_id, data.get("tool"))["class"] = _short(data.get("tool_class"), 40)
        elif kind == EventType.PERMISSION_REQUEST and call_id:
            call = self._call(call_id, data.get("tool"))
            self.requests[str(data.get("request_id") or "")] = call_id
            call["server"] = _short(data.get("server"))
            call["class"] = call["class"] or _short(data.get("tool_class"), 40)
            preview = data.get("preview") if isinstance(data.get("preview"), dict) else {}
            for key in _DIGEST_KEYS:
                value = preview.get(key)
                if isinstance(value, str) and 0 < len(value) <= 128:
                    call["digests"][key] = value
        elif kind == EventType.PERMISSION_RESOLVED:
            found = self.requests.get(str(data.get("request_id") or ""))
            if found is not None:
                call = self._call(found)
                call["decided_by"] = _short(data.get("answered_by")) or "the broker"
                call["scope"] = _short(data.get("scope"), 20)
        elif kind == EventType.REVIEW and call_id:
            call = self._call(call_id)
            call["decided_by"] = f"reviewer {_short(data.get('model'), 100) or 'model'}"
        elif kind == EventType.TOOL_DECIDED and call_id:
            call = self._call(call_id, data.get("tool"))
            call["decision"] = _short(data.get("decision"), 20)
            call["code"] = _short(data.get("code"), 60)
        elif kind == EventType.TOOL_FINISHED and call_id:
            call = self._call(call_id)
            call["is_error"] = bool(data.get("is_error"))
            try:
                call["duration_ms"] = round(float(data.get("duration_ms") or 0.0), 3)
            except (TypeError, ValueError):
                pass

    def finish(self, kind: Any, data: dict[str, Any]) -> dict[str, Any]:
        """The record, once the run ended with ``kind`` (a terminal event type)."""
        self.record["outcome"] = str(kind or "lost").removeprefix("run.").lstrip("_")
        code = data.get("code")
        self.record["code"] = _short(code, 60) if isinstance(code, str) else None
        self.record["duration_s"] = round(time.monotonic() - self.started, 3)
        for call in self.record["tool_calls"]:
            if call["decided_by"] is None and call["decision"] is not None:
                # no card was shown: the grant (and the class rules) allowed it, or the gate refused it
                call["decided_by"] = "grant" if call["decision"] == "allow" else "gate"
        return self.record

    def pushed(self) -> bool:
        """Whether a call of this run may have pushed a file into the Jupyter root."""
        return any("push" in str(call["tool"]) and call["decision"] == "allow" for call in self.record["tool_calls"])


def footer_suffix(record: dict[str, Any]) -> str:
    """What the cell's footer line adds from the record (Markdown): model and backend, tool calls, checkpoints.
    The model name comes from the broker: shown as code, backticks and line breaks removed. The backend is
    named once when it is the model's name too (the demo backend's model is ``demo``: "`demo` via demo" read
    as a stutter)."""
    model = " ".join(str(record.get("model") or "?").replace("`", "'").split())[:80]
    backend = " ".join(str(record.get("backend") or "?").replace("`", "'").split())[:80]
    calls = len(record.get("tool_calls") or [])
    out = f" · `{model}`" if backend == model else f" · `{model}` via {backend}"
    if calls:
        out += f" · {calls} tool call{'' if calls == 1 else 's'}"
    checkpoints = record.get("checkpoints") or []
    if checkpoints:
        out += f" · checkpoint{'' if len(checkpoints) == 1 else 's'} " + ", ".join(f"`{c}`" for c in checkpoints[:5])
    return out


def notebook_path(user_ns: dict[str, Any] | None = None) -> Path | None:
    """The open notebook's file, when this kernel can know it (``RELAY_NOTEBOOK``, VS Code's
    ``__vsc_ipynb_file__``, Jupyter's ``JPY_SESSION_NAME``, tried absolute, then from the working
    directory, then by its file name there: Jupyter starts a kernel in the notebook's directory)."""
    candidates = [os.environ.get("RELAY_NOTEBOOK", "").strip()]
    value = (user_ns or {}).get("__vsc_ipynb_file__")
    candidates.append(value.strip() if isinstance(value, str) else "")
    candidates.append(os.environ.get("JPY_SESSION_NAME", "").strip())
    for raw in filter(None, candidates):
        for path in (Path(raw), Path.cwd() / raw, Path.cwd() / Path(raw).name):
            if path.suffix == ".ipynb" and path.is_file():
                return path
    return None


def saved_records(user_ns: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The provenance records of this kernel's notebook file as saved ([] when its file is unknown or
    unreadable: lineage is a convenience, never a reason for a cell to fail)."""
    try:
        path = notebook_path(user_ns)
        return read_notebook(path) if path is not None else []
    except (OSError, ValueError, TypeError, AttributeError):
        return []


def read_notebook(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every provenance record saved in a notebook file, in cell order (``cell_id`` filled from the cell)."""
    with open(path, encoding="utf-8") as handle:
        notebook = json.load(handle)
    found = []
    for index, cell in enumerate(notebook.get("cells") or []):
        if not isinstance(cell, dict):
            continue
        for output in cell.get("outputs") or []:
            meta = (output.get("metadata") or {}).get(METADATA_KEY) if isinstance(output, dict) else None
            record = meta.get("provenance") if isinstance(meta, dict) else None
            if isinstance(record, dict) and "run_id" in record:
                found.append({**record, "cell_id": cell.get("id") or record.get("cell_id"), "cell_index": index})
    return found


def rows(records: list[dict[str, Any]], *, calls: bool = False) -> list[dict[str, Any]]:
    """Flat rows for a DataFrame: one per answer, or (``calls``) one per tool call."""
    out = []
    for record in records:
        base = {"run_id": record.get("run_id"), "cell_id": record.get("cell_id"),
                "cell_index": record.get("cell_index"), "model": record.get("model"),
                "backend": record.get("backend")}
        if calls:
            for call in record.get("tool_calls") or []:
                out.append({**base, **{k: call.get(k) for k in _CALL_KEYS},
                            "digests": dict(call.get("digests") or {})})
            continue
        tokens = record.get("tokens") or {}
        started = record.get("started_at")
        out.append({**base, "mode": record.get("mode"), "outcome": record.get("outcome"),
                    "code": record.get("code"),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else None,
                    "duration_s": record.get("duration_s"), "input_tokens": tokens.get("input"),
                    "output_tokens": tokens.get("output"), "cache_creation_tokens": tokens.get("cache_creation"),
                    "cache_read_tokens": tokens.get("cache_read"), "tokens": tokens.get("total"),
                    "cost_usd": record.get("cost_usd"), "tool_calls": len(record.get("tool_calls") or []),
                    "checkpoints": list(record.get("checkpoints") or []),
                    "conversation": record.get("conversation")})
    return out
