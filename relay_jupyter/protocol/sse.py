"""Server-Sent Events framing (https://html.spec.whatwg.org/multipage/server-sent-events.html).

Hand-written because it is a dozen lines and sits on the hot path of every event; the JSON payload
is always one line (``json.dumps`` escapes newlines), so one ``data:`` field per event suffices.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only an annotation here: the kernel parses SSE and must not pay for pydantic (~0.1-0.2 s)
    from ..core.types import Event

__all__ = ["encode_event", "encode_comment", "encode_raw", "parse_stream"]


def encode_raw(event_id: int | None, event_type: str, data: Any) -> bytes:
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event_type}\ndata: {payload}\n\n".encode()


def encode_event(event: Event) -> bytes:
    """One stored event as an SSE frame; ``data`` is the whole event (id, ts, type, run_id, data)."""
    return encode_raw(event.id, event.type, event.model_dump(mode="json"))


def encode_comment(text: str = "") -> bytes:
    """A comment line: used as the heartbeat. Clients ignore it."""
    return f": {text}\n\n".encode()


def parse_stream(buffer: str) -> tuple[list[dict[str, Any]], str]:
    """Split complete frames off ``buffer``. Returns (frames, rest); each frame is
    ``{"id": str|None, "event": str, "data": str}``. Comments are skipped."""
    frames: list[dict[str, Any]] = []
    buffer = buffer.replace("\r\n", "\n")
    while "\n\n" in buffer:
        raw, buffer = buffer.split("\n\n", 1)
        frame: dict[str, Any] = {"id": None, "event": "message", "data": []}
        for line in raw.split("\n"):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                frame["data"].append(value)
            elif field in ("id", "event"):
                frame[field] = value
        if frame["data"]:
            frame["data"] = "\n".join(frame["data"])
            frames.append(frame)
    return frames, buffer
