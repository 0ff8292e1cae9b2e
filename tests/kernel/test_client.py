"""The asyncio RPC/SSE client against real sockets: tcp and unix, hostile answers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from relay_jupyter.kernel.client import Endpoint, RelayClient
from relay_jupyter.kernel.discovery import discover
from relay_jupyter.kernel.errors import AgentError, BrokerUnreachable, RpcError

from .fake_broker import CREDENTIAL, FakeBroker


async def _raw_server(reply: bytes) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.asyncio
async def test_rpc_and_events_over_tcp() -> None:
    with FakeBroker() as fake:
        client = RelayClient(Endpoint(fake.url, f"RelayKernel {CREDENTIAL}", "t"))
        assert (await client.call("grants.get"))["grant"]["tools"] == ["*"]
        fake.script([("text", "hi")])
        stream = client.events()
        assert (await anext(stream))["type"] == "_connected"
        run = await client.call("run.start", {"prompt": "x"})
        kinds = []
        async with asyncio.timeout(5):
            async for event in stream:
                kinds.append(event["type"])
                if event["type"] == "run.done":
                    break
        await stream.aclose()
        assert kinds == ["run.started", "run.text_delta", "run.done"] and run["run_id"]


@pytest.mark.asyncio
async def test_rpc_over_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "relay.sock"
    with FakeBroker(unix_path=str(sock)) as fake:
        client = RelayClient(Endpoint(fake.url, None, "t"))
        assert "grant" in await client.call("grants.get")
        with pytest.raises(RpcError) as info:
            await client.call("no.such")
        assert info.value.rpc_code == -32601


@pytest.mark.asyncio
async def test_refusal_code_is_kept() -> None:
    with FakeBroker() as fake:
        fake.refuse_start = ("BUDGET_EXCEEDED", "daily tokens used")
        client = RelayClient(Endpoint(fake.url, f"RelayKernel {CREDENTIAL}"))
        with pytest.raises(RpcError) as info:
            await client.call("run.start", {})
        assert info.value.code == "BUDGET_EXCEEDED" and "relay.budget()" in info.value.message


@pytest.mark.asyncio
@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nnot json",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]",
    b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n",
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n{\"jsonrpc\":\"2.0\",\"error\":5}",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFF\r\n",
])
async def test_hostile_answers_are_one_clean_error(reply: bytes) -> None:
    server, port = await _raw_server(reply)
    async with server:
        client = RelayClient(Endpoint(f"http://127.0.0.1:{port}/relay/", "Bearer secret-token"))
        with pytest.raises(AgentError) as info:
            await client.call("grants.get")
        assert "secret-token" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.asyncio
async def test_oversized_response_is_refused() -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "result": "x" * (17 * 1024 * 1024)}).encode()
    server, port = await _raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    async with server:
        client = RelayClient(Endpoint(f"http://127.0.0.1:{port}/relay/"))
        with pytest.raises(AgentError, match="too large"):
            await client.call("grants.get")


@pytest.mark.asyncio
async def test_unreachable_is_one_line() -> None:
    client = RelayClient(Endpoint("unix:///nonexistent/relay.sock"), connect_timeout=1)
    with pytest.raises(BrokerUnreachable) as info:
        await client.call("grants.get")
    assert "unreachable" in info.value.message


def test_endpoint_repr_hides_credential() -> None:
    assert "cred" not in repr(Endpoint("http://x/relay/", "RelayKernel cred"))


@pytest.mark.asyncio
async def test_discovery_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RELAY_URL", "http://127.0.0.1:1/relay/")
    monkeypatch.setenv("RELAY_KERNEL_CREDENTIAL", "c1")
    assert (await discover()).auth == "RelayKernel c1"
    monkeypatch.delenv("RELAY_KERNEL_CREDENTIAL")
    monkeypatch.setenv("RELAY_TOKEN", "t1")
    assert (await discover()).auth == "Bearer t1"
    monkeypatch.delenv("RELAY_TOKEN")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data" / "relay").mkdir(parents=True)
    (tmp_path / "data" / "relay" / "daemon_token").write_text("filetoken\n")
    assert (await discover()).auth == "Bearer filetoken"
    monkeypatch.setenv("RELAY_URL", "unix:///tmp/x.sock")
    assert (await discover()).auth is None
    monkeypatch.delenv("RELAY_URL")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    with pytest.raises(BrokerUnreachable, match="no daemon"):
        await discover(start_daemon=False)


@pytest.mark.asyncio
async def test_discovery_uses_a_running_daemon_socket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RELAY_URL", "RELAY_KERNEL_CREDENTIAL", "RELAY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    (tmp_path / "relay").mkdir()
    with FakeBroker(unix_path=str(tmp_path / "relay" / "relay.sock")):
        endpoint = await discover(start_daemon=False)
        assert endpoint.url == f"unix://{tmp_path}/relay/relay.sock"
        assert "grant" in await RelayClient(endpoint).call("grants.get")
