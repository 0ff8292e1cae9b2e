"""A hub kernel's ``claude`` CLI (``relay.claude_env()``) is that kernel's client on the hub service, as its SDK
clients are: the CLI takes the kernel's ``X-Relay-Client`` / ``X-Relay-Instance`` (and, on a daemon, its
``X-Relay-Kernel``) through ``ANTHROPIC_CUSTOM_HEADERS``, so its requests are charged to the notebook's origin and
the service's server check (``end_kernels_of_gone_servers`` with ``OpenRequests``) cuts them with the kernel and
refuses the instance after. Before, the CLI sent none of them: its requests were ``user:<name>/client:default``'s
(not the notebook's grant, not the kernel's client id), so the check could neither find nor end them.

The service's real gate and endpoints without a hub (the ``served`` rig of ``test_hub_server_scope.py``), the
shipped FakeAnthropic, and the real ``claude`` CLI bundled in the claude-agent-sdk wheel, which may only run inside
a network namespace (``make test-claude-code``); the unit test of the environment runs anywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from relay_jupyter.kernel.errors import AgentError
from relay_jupyter.kernel.sdk_clients import claude_env
from relay_jupyter.server.hub_service import end_kernels_of_gone_servers
from relay_jupyter.testing import Reply, text

from .test_hub_server_scope import ALICE, INST, PREFIX, _iso, _rpc, served  # noqa: F401  (served: the fixture)

pytest.importorskip("jupyterhub", reason="jupyterhub is not installed (pip install -e '.[test]')")

MODEL = "claude-test-1"


def _isolated() -> bool:
    """True inside a network namespace with only loopback (``unshare -n``), as tests/kernel/test_claude_code_kernel's
    (tests/hub is its own package: no import across)."""
    try:
        routes = Path("/proc/net/route").read_text().splitlines()[1:]
        ifaces = {line.split()[0].rstrip(":") for line in Path("/proc/net/dev").read_text().splitlines()[2:]
                  if line.strip()}
    except OSError:
        return False
    return not routes and ifaces <= {"lo"}


def test_claude_env_carries_the_kernels_headers_as_its_sdk_clients_do(monkeypatch) -> None:
    endpoint = SimpleNamespace(auth="Bearer tok-lab", client_name="kernel:cli.ipynb",
                               url="http://127.0.0.1:1/services/relay/relay/")
    monkeypatch.setenv("RELAY_KERNEL_INSTANCE", INST["lab"])
    base = {"PATH": "/usr/bin", "ANTHROPIC_AUTH_TOKEN": "sk-ant-user-own", "ANTHROPIC_CUSTOM_HEADERS":
            "X-Relay-Profile: team\nx-relay-client: kernel:other.ipynb\nX-Relay-Instance: 00000000000000ff"}
    env = claude_env(endpoint, base)
    lines = env["ANTHROPIC_CUSTOM_HEADERS"].split("\n")
    # the kernel's own two first; an inherited line naming one of them is dropped (never two values), others stay
    assert lines == ["X-Relay-Client: kernel:cli.ipynb", f"X-Relay-Instance: {INST['lab']}", "X-Relay-Profile: team"]
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1/services/relay/relay/anthropic"
    assert env["ANTHROPIC_API_KEY"] == "tok-lab" and "ANTHROPIC_AUTH_TOKEN" not in env
    # a daemon's registered kernel: its credential too
    registered = SimpleNamespace(auth="RelayKernel rk1.x.y", client_name="kernel:cli.ipynb", kernel_credential="rk1.x.y",
                                 url="http://127.0.0.1:1/")
    monkeypatch.delenv("RELAY_KERNEL_INSTANCE")
    assert claude_env(registered, {})["ANTHROPIC_CUSTOM_HEADERS"].split("\n") == [
        "X-Relay-Client: kernel:cli.ipynb", "X-Relay-Kernel: rk1.x.y"]
    # a configured client name with a newline would add a header of its own to every CLI request: one-line refusal
    hostile = SimpleNamespace(auth="Bearer tok", client_name="kernel:a\nX-Relay-Panel: 1", url="http://127.0.0.1:1/")
    with pytest.raises(AgentError, match="X-Relay-Client header .* not one printable line"):
        claude_env(hostile, {})


def _cli() -> str:
    claude_agent_sdk = pytest.importorskip("claude_agent_sdk")
    return str(Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")


async def _start_cli(env: dict[str, str], prompt: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        _cli(), "-p", prompt, "--model", MODEL, "--output-format", "json", "--max-turns", "1",
        env={**env, "HOME": tempfile.mkdtemp(prefix="hub-cli-home-")},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def _finish(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 180)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, (out + err).decode(errors="replace")


@pytest.mark.peer
@pytest.mark.slow
@pytest.mark.skipif(not _isolated(), reason="run in a network namespace: make test-claude-code")
@pytest.mark.asyncio
async def test_a_hub_kernels_claude_cli_is_its_client_charged_to_its_notebook_and_cut_with_its_server(
        served, monkeypatch) -> None:  # noqa: F811  (the imported fixture)
    s = served
    client, instance = "kernel:cli.ipynb", INST["lab"]
    client_id, origin = f"user:{ALICE}/{client}#{instance}", f"user:{ALICE}/notebook:cli.ipynb"
    status, reply = await _rpc(s, "tok-lab", client, instance, "grants.create", {"tools": ["*"], "models": ["*"]})
    assert status == 200 and "result" in reply, reply
    s.hub.servers = {"lab": {"name": "lab", "ready": True, "started": _iso(500.0)}}
    # the kernel's environment on her "lab" server: the thin server's instance id; the CLI gets claude_env's
    monkeypatch.setenv("RELAY_KERNEL_INSTANCE", instance)
    endpoint = SimpleNamespace(auth="Bearer tok-lab", client_name=client, url=f"http://127.0.0.1:{s.port}{PREFIX}")
    env = claude_env(endpoint, {"PATH": os.environ.get("PATH", "/usr/bin")})

    s.fake.enqueue(Reply(text(" ".join(["word"] * 400)), tokens_per_second=20))  # ~20 s: open while we look
    first = len(s.fake.requests)
    proc = await _start_cli(env, "a long answer please")
    try:
        async with asyncio.timeout(120):  # the CLI's streamed request reached the model through the gate ...
            while len(s.fake.requests) == first:
                assert proc.returncode is None, await _finish(proc)
                await asyncio.sleep(0.05)
        assert len(s.fake.requests) == first + 1
        assert s.requests.model_clients() == {client_id}  # ... and is open on the service as the kernel's client
        assert s.broker.ledger.usage(origin)["reserved_tokens"] > 0  # held on the notebook's budget, not "default"'s
        # her server still there: the check leaves it alone; gone: it cuts the CLI's stream with the kernel
        assert await end_kernels_of_gone_servers(s.broker, s.gate, s.hub.url, "svc-token", s.requests) == {}
        s.hub.servers = {}
        ended = await end_kernels_of_gone_servers(s.broker, s.gate, s.hub.url, "svc-token", s.requests)
        assert ended[client_id]["closed_requests"] == 1, ended
        rc, shown = await _finish(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # the CLI did not get its answer; a retry of its (the same instance) was refused and reached no model
    assert rc != 0 or " ".join(["word"] * 400) not in shown, shown
    assert len(s.fake.requests) == first + 1, shown
    async with asyncio.timeout(20):  # the endpoint settled what the cut stream held
        while s.broker.ledger.usage(origin)["reserved_tokens"]:
            await asyncio.sleep(0.05)
    assert s.requests.model_clients() == set()

    # the ended instance's next CLI run is refused (410: its server is gone) before any model request
    rc, shown = await _finish(await _start_cli(env, "again"))
    assert rc != 0, shown
    assert "410" in shown or "server is gone" in shown, shown
    assert len(s.fake.requests) == first + 1
    # the gate's rows of the CLI's one request are the notebook's: allowed, then settled (cut: what it used)
    decisions = [r.decision for r in s.broker.audit.tail(100, origin=origin) if r.tool.startswith("model:")]
    assert "allow" in decisions and "settled" in decisions, decisions
    assert not [r for r in s.broker.audit.tail(100, origin=f"user:{ALICE}/client:default")]
