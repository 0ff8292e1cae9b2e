"""A stdio MCP server (MCP SDK 2.3: protocol 2026-07-28) whose tools ask the user (elicitation).

    python tests/mcp/elicit_server.py

On 2026-07-28 a server cannot send a request of its own over stdio: it asks by answering the
``tools/call`` with an ``InputRequiredResult`` (the SDK's ``Resolve`` / ``Elicit`` markers), and the
client retries the call with the answers — so relay's handler runs inside the calling task.

``ask_name()`` asks for a name and an age and answers with what it got.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import Elicit, ElicitationResult, MCPServer, Resolve
from pydantic import BaseModel, Field

server = MCPServer("elicit")


class Person(BaseModel):
    name: str = Field(description="Your name")
    age: int = Field(default=30, description="Your age", ge=0, le=150)


def _who() -> Elicit[Person]:
    return Elicit("Who are you?", Person)


@server.tool()
async def ask_name(person: Annotated[ElicitationResult[Person], Resolve(_who)]) -> str:
    """Ask the user for their name."""
    if person.action == "accept":
        return f"accepted: {person.data.name} ({person.data.age})"
    return f"answer: {person.action}"


if __name__ == "__main__":
    server.run("stdio")
