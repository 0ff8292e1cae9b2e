"""Endpoint policy: https or loopback only, no credentials in URLs, headers bounded and never shown."""

from __future__ import annotations

import pytest

from relay_jupyter.core.errors import Code, ConfigRefusal
from relay_jupyter.mcp.policy import check_endpoint, check_headers, describe_headers, is_loopback_host


@pytest.mark.parametrize(
    "url",
    [
        "https://mcp.example.com/mcp",
        "https://example.com:8443/a/b?x=1",
        "http://127.0.0.1:8080/mcp",
        "http://127.3.4.5/mcp",
        "http://localhost:9/mcp",
        "http://[::1]:9000/mcp",
        "HTTPS://EXAMPLE.COM/mcp",
    ],
)
def test_allowed_endpoints(url: str) -> None:
    assert check_endpoint(url) == url


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://evil.com/mcp", "loopback"),
        ("http://example.com:80/mcp", "use https"),
        ("http://0.0.0.0:8000/mcp", "loopback"),
        ("http://10.0.0.1/mcp", "loopback"),
        ("http://127.0.0.1.evil.com/mcp", "loopback"),
        ("http://localhost.evil.com/mcp", "loopback"),
        ("http://[::ffff:10.0.0.1]/mcp", "loopback"),
        ("ftp://127.0.0.1/mcp", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("ws://127.0.0.1/mcp", "scheme"),
        ("127.0.0.1:8000/mcp", "scheme"),
        ("https://user:pw@example.com/mcp", "credentials"),
        ("https://token@example.com/mcp", "credentials"),
        ("http://user:pw@127.0.0.1/mcp", "credentials"),
        ("https://example.com/mcp?token=abc", "query"),
        ("https://example.com/mcp?access_token=abc", "query"),
        ("https://example.com/mcp?API-KEY=abc", "query"),
        ("https://example.com/mcp?x=1&github_token=abc", "query"),
        ("https://example.com/mcp?X-Amz-Signature=abc", "query"),
        ("https://exa mple.com/mcp", "whitespace"),
        ("https://example.com/\nmcp", "control"),
        ("https://example.com:99999/mcp", "not a valid URL"),
        ("https:///mcp", "no host"),
        ("", "empty"),
        ("https://example.com/" + "a" * 3000, "longer"),
    ],
)
def test_refused_endpoints(url: str, fragment: str) -> None:
    with pytest.raises(ConfigRefusal) as info:
        check_endpoint(url)
    assert info.value.code == Code.ENDPOINT_REFUSED
    assert fragment in info.value.message
    # The refusal never repeats a credential.
    assert "pw" not in info.value.message.replace("passw", "")
    assert "abc" not in info.value.message


def test_loopback_hosts() -> None:
    assert is_loopback_host("localhost") and is_loopback_host("127.0.0.1") and is_loopback_host("[::1]")
    assert is_loopback_host("::ffff:127.0.0.1")
    assert not is_loopback_host("localhost.") and not is_loopback_host("::") and not is_loopback_host("evil.com")


def test_headers_checked_and_values_hidden() -> None:
    ok = check_headers({"Authorization": "Bearer sk-secret-value", "X-Team": "a"})
    assert ok == {"Authorization": "Bearer sk-secret-value", "X-Team": "a"}
    shown = describe_headers(ok)
    assert "sk-secret-value" not in shown and "Authorization: <hidden>" in shown
    for bad, fragment in [
        ({"Mcp-Session-Id": "x"}, "managed"),
        ({"Content-Type": "text/plain"}, "managed"),
        ({"Bad Name": "x"}, "invalid"),
        ({"X-A": "line\r\nInjected: 1"}, "line break"),
        ({"X-A": "x" * 9000}, "longer"),
        ({"x-a": "1", "X-A": "2"}, "twice"),
        ({f"X-{i}": "v" for i in range(40)}, "at most"),
    ]:
        with pytest.raises(ConfigRefusal) as info:
            check_headers(bad)
        assert fragment in info.value.message
        assert "Injected" not in info.value.message
