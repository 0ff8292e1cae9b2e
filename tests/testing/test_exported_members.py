"""The chosen public API of relay_jupyter.testing (STYLE.md: a public API guarded by a test)."""

from __future__ import annotations

from relay_jupyter import testing
from relay_jupyter.testing import fake_anthropic, fake_openai, fault_model_server, mcp_server, pytest_plugin, script

PUBLIC = {
    "ErrorReply", "FakeAnthropic", "FakeOpenAI", "FaultModelServer", "RecordedRequest", "Reply", "TextBlock", "ThinkingBlock",
    "ToolUseBlock", "Usage", "text", "thinking", "tool_use",
}


def test_package_exports():
    assert set(testing.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(testing, name) is not None
    assert set(dir(testing)) >= PUBLIC


def test_module_exports_exist():
    for module in (fake_anthropic, fake_openai, fault_model_server, mcp_server, pytest_plugin, script):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_unknown_name_is_an_attribute_error():
    try:
        testing.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
