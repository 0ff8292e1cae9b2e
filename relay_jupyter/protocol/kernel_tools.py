"""The kernel tools, listed once for both processes: the broker (which offers, classifies and gates
them, ``broker/kernel_bridge.KERNEL_TOOL_SPECS``) and the kernel (which runs them when asked,
``kernel/tools.KernelTools.NAMES``). Standard library only: the kernel imports it at ``%load_ext``.

A new kernel tool is one entry here, one method on ``kernel/tools.KernelTools`` (a test checks every
name has one), and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["KERNEL_TOOLS", "KERNEL_TOOL_NAMES", "KernelTool", "MAX_CODE_CHARS"]

#: Longest code accepted by the two code tools (characters); the kernel checks it again.
MAX_CODE_CHARS = 100_000


def _code_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"code": {"type": "string", "maxLength": MAX_CODE_CHARS}},
        "required": ["code"],
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class KernelTool:
    """One kernel tool as both processes know it (the broker makes a ``ToolSpec`` of it)."""

    name: str
    description: str
    input_schema: dict[str, Any] = field(hash=False)
    tool_class: str
    """``read`` | ``write`` (``core.types.ToolClass`` values)."""
    parallel_safe: bool = False
    runs_code: bool = False
    """Runs model-written code in the kernel: approved one call at a time (broker/permissions.py)."""


KERNEL_TOOLS: tuple[KernelTool, ...] = (
    KernelTool(
        name="list_variables",
        description="List the variables in the notebook's kernel namespace with their types and short reprs.",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        tool_class="read",
        parallel_safe=True,
    ),
    KernelTool(
        name="describe_dataframe",
        description="Describe a pandas DataFrame in the kernel: shape, dtypes, head and summary statistics.",
        input_schema={
            "type": "object",
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 200}},
            "required": ["name"],
            "additionalProperties": False,
        },
        tool_class="read",
        parallel_safe=True,
    ),
    KernelTool(
        name="propose_cell",
        description="Propose a new code cell to the user; it is inserted below the agent cell, not run.",
        input_schema=_code_schema(),
        tool_class="write",
    ),
    KernelTool(
        name="run_code",
        description="Run Python code in the notebook's kernel and return its output.",
        input_schema=_code_schema(),
        tool_class="write",
        runs_code=True,
    ),
)

KERNEL_TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in KERNEL_TOOLS)
