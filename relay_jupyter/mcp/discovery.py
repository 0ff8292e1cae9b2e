"""From what an MCP server lists to :class:`ToolSpec`, and from what it returns to a bounded result.

Everything a server sends is untrusted (seed 002): names, descriptions, schemas, annotations and
results. Discovery bounds and checks them:

- a tool is exposed as ``<server>__<tool>``; server names cannot contain ``__`` (config.py), so the
  split is unambiguous and a second server can never produce another server's tool name;
- the full name must match ``^[A-Za-z0-9_-]{1,64}$`` (what Anthropic and OpenAI accept);
- the input schema is at most ``MAX_SCHEMA_BYTES`` of canonical JSON, has an object root and is a
  valid JSON Schema (checked with ``jsonschema``), or the tool is skipped with a message;
- descriptions are cut at ``MAX_DESCRIPTION_CHARS``; at most ``MAX_TOOLS_PER_SERVER`` tools;
- annotations become ``hints`` only (never a class).

Results are rendered to text and capped at ``max_bytes`` with a truncation marker.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from ..core.types import ToolClass, ToolSpec, canonical_json

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "MAX_DESCRIPTION_CHARS",
    "MAX_LIST_PAGES",
    "MAX_SCHEMA_BYTES",
    "MAX_TOOLS_PER_SERVER",
    "SEPARATOR",
    "DiscoveredTool",
    "convert_tools",
    "qualified_name",
    "render_result",
    "split_name",
    "truncate_text",
]

SEPARATOR = "__"
MAX_SCHEMA_BYTES = 64 * 1024
MAX_DESCRIPTION_CHARS = 4096
MAX_TOOLS_PER_SERVER = 256
MAX_LIST_PAGES = 20
DEFAULT_MAX_OUTPUT_BYTES = 100 * 1024
_FULL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HINT_KEYS = ("read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint", "title")


@dataclass(frozen=True)
class DiscoveredTool:
    """A listed tool: its spec as the broker shows it (class still the WRITE default) and its remote name."""

    spec: ToolSpec
    remote_name: str



def _jsonschema() -> Any:
    """``jsonschema``, imported on first use: its import costs seconds on a loaded machine (it pulls
    ``rfc3987_syntax``, which builds a grammar), and the daemon, the CLI and broker start should not pay it."""
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators

    return jsonschema

def qualified_name(server: str, tool: str) -> str:
    """``server__tool``."""
    return f"{server}{SEPARATOR}{tool}"


def split_name(name: str) -> tuple[str, str] | None:
    """``server__tool`` -> ``(server, tool)``; None if ``name`` is not namespaced."""
    server, sep, tool = name.partition(SEPARATOR)
    if not sep or not server or not tool:
        return None
    return server, tool


def _hints(tool: types.Tool) -> dict[str, Any]:
    annotations = tool.annotations
    if annotations is None:
        return {}
    out: dict[str, Any] = {}
    for key in _HINT_KEYS:
        value = getattr(annotations, key, None)
        if isinstance(value, bool):
            out[key] = value
        elif isinstance(value, str):
            out[key] = value[:200]
    return out


def _check_schema(schema: Any) -> str | None:
    """Why ``schema`` is unusable, or None."""
    if not isinstance(schema, dict):
        return "its input schema is not an object"
    try:
        canonical = canonical_json(schema)
    except (TypeError, ValueError, RecursionError):
        return "its input schema cannot be serialised"
    size = len(canonical.encode())
    if size > MAX_SCHEMA_BYTES:
        return f"its input schema is {size} bytes (limit {MAX_SCHEMA_BYTES})"
    if schema.get("type") != "object":
        return "its input schema does not have an object root"
    return _meta_check(canonical)


_META_CHECKED: OrderedDict[str, str | None] = OrderedDict()
_META_CHECKED_MAX = 4096


def _meta_check(canonical: str) -> str | None:
    """``check_schema`` of a schema given as canonical JSON, remembered by its SHA-256 (4096 digests
    and verdicts, least recently used dropped): a server is re-listed before every call (docs/mcp.md,
    "Tool identity per call") and the meta-schema check costs milliseconds per tool, while schemas
    rarely change."""
    key = hashlib.sha256(canonical.encode()).hexdigest()
    if key in _META_CHECKED:
        _META_CHECKED.move_to_end(key)
        return _META_CHECKED[key]
    verdict = _meta_check_uncached(canonical)
    _META_CHECKED[key] = verdict
    while len(_META_CHECKED) > _META_CHECKED_MAX:
        _META_CHECKED.popitem(last=False)
    return verdict


def _meta_check_uncached(canonical: str) -> str | None:
    schema = json.loads(canonical)
    jsonschema = _jsonschema()
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"its input schema is not a valid JSON Schema ({exc.message[:120]})"
    except (RecursionError, ValueError, TypeError):
        return "its input schema is not a valid JSON Schema"
    return None


def convert_tools(server: str, source: str, tools: list[types.Tool]) -> tuple[list[DiscoveredTool], list[str]]:
    """Listed tools -> (usable tools, one message per skipped tool)."""
    found: list[DiscoveredTool] = []
    problems: list[str] = []
    seen: set[str] = set()
    for tool in tools:
        remote = tool.name
        full = qualified_name(server, remote)
        if len(found) >= MAX_TOOLS_PER_SERVER:
            problems.append(f"more than {MAX_TOOLS_PER_SERVER} tools; the rest are ignored")
            break
        if not _FULL_NAME.fullmatch(full):  # not match: its "$" also matches before a final "\n"
            problems.append(f"tool {remote[:80]!r} skipped: the name {full[:100]!r} is not 1-64 of [A-Za-z0-9_-]")
            continue
        if full in seen:
            problems.append(f"tool {remote!r} skipped: listed twice")
            continue
        reason = _check_schema(tool.input_schema)
        if reason is not None:
            problems.append(f"tool {remote!r} skipped: {reason}")
            continue
        seen.add(full)
        description = tool.description or ""
        if len(description) > MAX_DESCRIPTION_CHARS:
            description = description[:MAX_DESCRIPTION_CHARS] + " …[description truncated]"
        spec = ToolSpec(
            name=full,
            description=description,
            input_schema=dict(tool.input_schema),
            tool_class=ToolClass.WRITE,
            server=server,
            source=source,
            parallel_safe=False,
            hints=_hints(tool),
        )
        found.append(DiscoveredTool(spec=spec, remote_name=remote))
    return found, problems


def truncate_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """Cut ``text`` to at most ``max_bytes`` UTF-8 bytes plus a marker saying how much was dropped."""
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text, False
    head = data[:max_bytes].decode("utf-8", "ignore")
    dropped = len(data) - len(head.encode())
    return f"{head}\n…[output truncated: {dropped} more bytes not shown]", True


def _block_text(block: Any) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, (types.ImageContent, types.AudioContent)):
        kind = "image" if isinstance(block, types.ImageContent) else "audio"
        size = len(block.data) * 3 // 4
        return f"[{kind}: {block.mime_type}, about {size} bytes, not shown]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            return f"[resource {res.uri}]\n{res.text}"
        try:
            size = len(base64.b64decode(res.blob, validate=False))
        except (ValueError, TypeError):
            size = len(res.blob)
        return f"[binary resource {res.uri}: {res.mime_type or 'unknown type'}, {size} bytes, not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"


def render_result(result: types.CallToolResult, max_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> dict[str, Any]:
    """``{"content": str, "is_error": bool, "structured": Any, "truncated": bool}``, bounded by ``max_bytes``."""
    parts = [_block_text(block) for block in result.content]
    structured = result.structured_content
    text = "\n".join(parts)
    if not text and structured is not None:
        text = canonical_json(structured)
    content, truncated = truncate_text(text, max_bytes)
    if structured is not None and len(canonical_json(structured).encode()) > max_bytes:
        structured, truncated = None, True
    return {"content": content, "is_error": bool(result.is_error), "structured": structured, "truncated": truncated}
