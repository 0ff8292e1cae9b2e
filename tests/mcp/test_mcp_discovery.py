"""Discovery bounds (names, schemas, descriptions, counts), hints, result rendering and the output cap."""

from __future__ import annotations

import base64

import mcp_types as types

from relay_jupyter.core.types import ToolClass
from relay_jupyter.mcp.discovery import (
    MAX_DESCRIPTION_CHARS,
    MAX_SCHEMA_BYTES,
    MAX_TOOLS_PER_SERVER,
    convert_tools,
    render_result,
    split_name,
    truncate_text,
)

OBJ = {"type": "object", "properties": {"x": {"type": "string"}}}


def _tool(name: str, schema: object = OBJ, description: str = "d", **annotations: object) -> types.Tool:
    ann = types.ToolAnnotations(**annotations) if annotations else None
    return types.Tool.model_construct(name=name, description=description, input_schema=schema, annotations=ann)


def test_namespacing_and_split() -> None:
    found, problems = convert_tools("git", "mcp-server-git", [_tool("status"), _tool("a__b")])
    assert problems == []
    assert [t.spec.name for t in found] == ["git__status", "git__a__b"]
    assert [t.remote_name for t in found] == ["status", "a__b"]
    assert all(t.spec.server == "git" and t.spec.source == "mcp-server-git" for t in found)
    assert all(t.spec.tool_class == ToolClass.WRITE for t in found)  # default before pins/classify
    assert split_name("git__a__b") == ("git", "a__b")
    assert split_name("nope") is None and split_name("__x") is None and split_name("x__") is None


def test_bad_tools_are_skipped_with_a_reason() -> None:
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100}
                                             for i in range(MAX_SCHEMA_BYTES // 100)}}
    found, problems = convert_tools(
        "s", "src",
        [
            _tool("ok"),
            _tool("has space"),
            _tool("dots.and/slashes"),
            _tool("x" * 80),
            _tool("arr", {"type": "array"}),
            _tool("noroot", {"properties": {}}),
            _tool("invalid", {"type": "object", "properties": {"x": {"type": 12}}}),
            _tool("notdict", "schema"),
            _tool("huge", huge),
            _tool("ok"),
        ],
    )
    assert [t.spec.name for t in found] == ["s__ok"]
    text = "\n".join(problems)
    for fragment in ["'has space'", "dots.and/slashes", "not 1-64", "object root", "valid JSON Schema",
                     "not an object", "limit", "listed twice"]:
        assert fragment in text, fragment


def test_description_cut_and_tool_count_bounded() -> None:
    found, _ = convert_tools("s", "src", [_tool("long", description="y" * (MAX_DESCRIPTION_CHARS + 500))])
    assert len(found[0].spec.description) < MAX_DESCRIPTION_CHARS + 40
    assert found[0].spec.description.endswith("[description truncated]")
    many = [_tool(f"t{i}") for i in range(MAX_TOOLS_PER_SERVER + 10)]
    found, problems = convert_tools("s", "src", many)
    assert len(found) == MAX_TOOLS_PER_SERVER and "the rest are ignored" in problems[-1]


def test_annotations_are_hints_only() -> None:
    found, _ = convert_tools("s", "src", [_tool("r", read_only_hint=True, title="T" * 500)])
    spec = found[0].spec
    assert spec.hints["read_only_hint"] is True and len(spec.hints["title"]) == 200
    assert spec.tool_class == ToolClass.WRITE


def test_render_text_and_blocks() -> None:
    png = base64.b64encode(b"\x89PNG" + b"0" * 100).decode()
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="hello"),
            types.ImageContent(type="image", data=png, mime_type="image/png"),
            types.ResourceLink(type="resource_link", uri="file:///x", name="x"),
            types.EmbeddedResource(type="resource",
                                   resource=types.TextResourceContents(uri="file:///y", text="inner")),
        ],
        structured_content={"a": 1},
        is_error=False,
    )
    out = render_result(result)
    assert out["content"].startswith("hello\n[image: image/png")
    assert "[resource link: file:///x]" in out["content"] and "inner" in out["content"]
    assert png not in out["content"]  # binary never reaches the model as base64
    assert out["structured"] == {"a": 1} and out["is_error"] is False and out["truncated"] is False


def test_output_cap_with_marker() -> None:
    result = types.CallToolResult(content=[types.TextContent(type="text", text="é" * 10_000)],
                                  structured_content={"big": "z" * 10_000}, is_error=True)
    out = render_result(result, max_bytes=1000)
    assert len(out["content"].encode()) < 1100
    assert "[output truncated:" in out["content"] and out["truncated"] is True
    assert out["structured"] is None and out["is_error"] is True
    text, cut = truncate_text("short", 10)
    assert (text, cut) == ("short", False)


def test_structured_only_result_is_rendered() -> None:
    out = render_result(types.CallToolResult(content=[], structured_content={"k": [1, 2]}))
    assert out["content"] == '{"k":[1,2]}'


def test_remembered_schema_verdicts_are_the_same_verdicts() -> None:
    """The per-call re-list remembers meta-schema verdicts by the schema's digest: a second listing
    skips and accepts exactly what the first did (an invalid schema stays invalid)."""
    tools = [_tool("ok"), _tool("invalid", {"type": "object", "properties": {"x": {"type": 12}}}),
             _tool("fine", {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0}}})]
    first = convert_tools("s", "src", tools)
    second = convert_tools("s", "src", tools)
    assert [t.spec for t in first[0]] == [t.spec for t in second[0]]
    assert [t.spec.name for t in second[0]] == ["s__ok", "s__fine"]
    assert first[1] == second[1] and "valid JSON Schema" in second[1][0]
