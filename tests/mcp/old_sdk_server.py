"""A stdio MCP server built on an *old* MCP SDK (FastMCP of mcp 1.9 / 1.12), run from its own venv.

    <venv>/bin/python tests/mcp/old_sdk_server.py

mcp 1.9.x speaks protocol 2025-03-26 and 1.12.x 2025-06-18: the versions a user's older servers speak.
Tools: ``echo(text)`` (annotated read-only), ``ask_name()`` (an elicitation: asks the user for a name
and an age; 1.12 only), ``ask_password()`` (an elicitation whose form has a field named ``password``).
This file must not import relay_jupyter: it runs under the old SDK's interpreter (and has no
``from __future__ import annotations``: FastMCP finds the ``Context`` parameter by its real annotation).
"""


from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

server = FastMCP("old-sdk")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=False))
def echo(text: str) -> str:
    """Return the text unchanged."""
    return f"echo: {text}"


class Person(BaseModel):
    name: str = Field(description="Your name")
    age: int = Field(default=30, description="Your age")


class Login(BaseModel):
    username: str = Field(description="User name")
    password: str = Field(description="Password")


@server.tool()
async def ask_name(ctx: Context) -> str:
    """Ask the user for their name (an elicitation)."""
    if not hasattr(ctx, "elicit"):
        return "this SDK cannot elicit"
    result = await ctx.elicit(message="Who are you?", schema=Person)
    if result.action == "accept":
        return f"accepted: {result.data.name} ({result.data.age})"
    return f"answer: {result.action}"


@server.tool()
async def ask_password(ctx: Context) -> str:
    """Ask the user for a password (an elicitation relay must not pass on silently)."""
    result = await ctx.elicit(message="Log in to continue", schema=Login)
    return f"answer: {result.action}" + (f" {result.data.username}" if result.action == "accept" else "")


if __name__ == "__main__":
    server.run("stdio")
