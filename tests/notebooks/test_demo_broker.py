"""The documentation notebooks' private broker (issue 13 item 6): an MCP server that cannot start is reported by
``wait_for_tools`` at once, in one line with its reason (no 30 s wait, no traceback), and ``log_tail()`` shows
relay's own messages, not the access lines of its own polling. A real daemon and a real (failing) MCP server."""

from __future__ import annotations

import sys

import pytest

from relay_jupyter.testing.demo_broker import NotebookBroker, ToolsNotOffered

pytestmark = pytest.mark.slow


def test_a_server_that_cannot_start_is_reported_in_one_line_with_its_reason() -> None:
    broker = NotebookBroker(mcp_servers={
        "time": {"command": sys.executable, "args": ["-m", "relay_no_such_mcp_module"]}}).start()
    try:
        with pytest.raises(ToolsNotOffered) as info:
            broker.wait_for_tools("time__get_current_time", timeout=600)  # the reason ends it, not the timeout
        message = str(info.value)
        assert "MCP server 'time' unavailable" in message and "relay_no_such_mcp_module" in message, message
        assert "after 600 s" not in message
        (line,) = info.value._render_traceback_()
        assert line.startswith("\x1b[0;31mrelay:\x1b[0m the broker does not offer time__get_current_time")
        assert "\n" not in line
        tail = broker.log_tail()
        assert "MCP server 'time' unavailable" in tail
        # wait_for_tools polled tools.list several times: those requests are in the log, but not in the tail
        assert "relay_jupyter.daemon.access" not in tail
        assert "relay_jupyter.daemon.access" in broker.log_tail(400, access=True)
    finally:
        broker.stop()
