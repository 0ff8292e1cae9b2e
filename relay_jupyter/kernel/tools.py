"""Kernel tools: run in this kernel when the broker asks (``kernel.tool_request``).

The broker owns the classes and the gate: ``list_variables`` and ``describe_dataframe`` are reads,
``propose_cell`` and ``run_code`` are writes (a human approved them before the request arrives).
Everything returned is bounded, because it goes to a model as untrusted material.
"""

from __future__ import annotations

import types
from typing import Any

from ..protocol.kernel_tools import KERNEL_TOOL_NAMES

__all__ = ["MAX_RESULT_CHARS", "KernelTools", "summarize"]

MAX_RESULT_CHARS = 16_000
MAX_CODE_CHARS = 100_000
_MAX_VARS = 200


def _cut(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… [cut: {len(text) - limit} more characters]"


def _is_dataframe(value: Any) -> bool:
    # checked by type name so pandas is imported only when a DataFrame actually exists
    return type(value).__name__ == "DataFrame" and type(value).__module__.startswith("pandas")


def summarize(name: str, value: Any, limit: int = 4000) -> str:
    """A bounded summary of one variable: type, shape, and for a DataFrame dtypes, head and describe."""
    if _is_dataframe(value):
        import pandas as pd

        with pd.option_context("display.max_columns", 30, "display.width", 160, "display.max_colwidth", 40):
            parts = [f"{name}: pandas.DataFrame shape={value.shape}",
                     "dtypes:\n" + value.dtypes.to_string()[:1500],
                     "head:\n" + value.head(5).to_string()[:2000]]
            try:
                parts.append("describe:\n" + value.describe(include="all").to_string()[:2500])
            except (ValueError, TypeError):
                pass
        return _cut("\n".join(parts), limit)
    shape = getattr(value, "shape", None)
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 -- a hostile __repr__ must not break the tool
        text = f"<repr failed: {type(exc).__name__}>"
    head = f"{name}: {kind}" + (f" shape={tuple(shape)}" if isinstance(shape, tuple) else "")
    return _cut(f"{head}\n{text}", limit)


class KernelTools:
    """The four kernel tools over one IPython shell."""

    NAMES = KERNEL_TOOL_NAMES  # the one list, shared with the broker (protocol/kernel_tools.py)

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def call(self, tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run ``tool``; returns ``(content, is_error)``. Never raises for a tool failure."""
        if not isinstance(arguments, dict):
            return "arguments must be an object", True
        handler = getattr(self, f"_tool_{tool}", None) if tool in self.NAMES else None
        if handler is None:
            return f"unknown kernel tool {tool!r}", True
        try:
            return handler(**arguments)
        except TypeError as exc:
            return f"bad arguments for {tool}: {exc}", True

    def _user_variables(self) -> list[tuple[str, Any]]:
        hidden = getattr(self.shell, "user_ns_hidden", {})
        out = []
        for name, value in self.shell.user_ns.items():
            if name.startswith("_") or name in hidden or name in ("In", "Out", "exit", "quit", "get_ipython"):
                continue
            if isinstance(value, (types.ModuleType, types.FunctionType, type, types.BuiltinFunctionType)):
                continue
            out.append((name, value))
        return out

    def _tool_list_variables(self) -> tuple[str, bool]:
        rows = []
        variables = self._user_variables()
        for name, value in variables[:_MAX_VARS]:
            shape = getattr(value, "shape", None)
            size = f" shape={tuple(shape)}" if isinstance(shape, tuple) else (
                f" len={len(value)}" if isinstance(value, (list, dict, tuple, set, str, bytes)) else "")
            rows.append(f"{name}: {type(value).__name__}{size}")
        if len(variables) > _MAX_VARS:
            rows.append(f"… and {len(variables) - _MAX_VARS} more")
        return _cut("\n".join(rows) or "(no user variables)"), False

    def _tool_describe_dataframe(self, name: str) -> tuple[str, bool]:
        if not isinstance(name, str) or name not in self.shell.user_ns:
            return f"no variable named {name!r}", True
        value = self.shell.user_ns[name]
        if not _is_dataframe(value):
            return f"{name} is a {type(value).__name__}, not a pandas DataFrame", True
        return summarize(name, value, MAX_RESULT_CHARS), False

    def _tool_propose_cell(self, code: str) -> tuple[str, bool]:
        if not isinstance(code, str) or len(code) > MAX_CODE_CHARS:
            return f"code must be a string of at most {MAX_CODE_CHARS} characters", True
        # a set_next_input payload rides on this cell's execute_reply: the frontend inserts the cell
        # below and does not run it
        self.shell.set_next_input(code, replace=False)
        return "proposed a new cell below the current one (not run)", False

    def _tool_run_code(self, code: str) -> tuple[str, bool]:
        if not isinstance(code, str) or len(code) > MAX_CODE_CHARS:
            return f"code must be a string of at most {MAX_CODE_CHARS} characters", True
        from IPython.utils.capture import capture_output

        with capture_output(display=True) as captured:
            result = self.shell.run_cell(code, store_history=False, silent=False)
        parts = []
        if captured.stdout:
            parts.append("stdout:\n" + captured.stdout)
        if captured.stderr:
            parts.append("stderr:\n" + captured.stderr)
        for output in captured.outputs:
            text = output.data.get("text/plain") if hasattr(output, "data") else None
            if text:
                parts.append("display:\n" + str(text))
        if result.result is not None:
            try:
                parts.append("result:\n" + repr(result.result))
            except Exception as exc:  # noqa: BLE001 -- user objects' __repr__ may raise anything
                parts.append(f"result: <repr failed: {type(exc).__name__}>")
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            parts.append(f"error: {type(error).__name__}: {error}")
        return _cut("\n".join(parts) or "(no output)"), error is not None
