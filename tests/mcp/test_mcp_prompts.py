"""MCP prompts as a run's request: ``%agent --prompt server:name [--arg NAME=VALUE ...]`` (issue 20 item 4).

The broker lists and fetches prompts (``mcp.prompts_list`` / ``mcp.prompt_get``) only from a server the
notebook's live grant reaches, checks the arguments against what the prompt declares before anything is
sent, and audits each fetch with the argument names, never their values. In a real kernel the cell shows
that the request is the server's text, and the model receives exactly that text.

Real parts: ``tests/mcp/resource_server.py`` (MCP SDK 2.3, stdio; prompt ``summarise(topic)``), a real
broker; for the kernel test a real Jupyter server, its kernel and the fake Anthropic server; the
``server-everything`` peer (its ``simple-prompt`` / ``args-prompt``) when installed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Code, RelayError
from relay_jupyter.core.types import Grant
from relay_jupyter.kernel.errors import AgentUsageError
from relay_jupyter.kernel.magics import parse_line
from relay_jupyter.mcp import McpRegistry
from relay_jupyter.mcp.config import McpConfig, StdioServerConfig

HERE = Path(__file__).parent
SERVER = HERE / "resource_server.py"
KERNEL = Caller(kind=CallerKind.KERNEL, origin="notebook:p.ipynb", client_id="kernel:p")
OTHER = Caller(kind=CallerKind.KERNEL, origin="notebook:other.ipynb", client_id="kernel:o")
SECRET_TOPIC = "topic-value-7f3a"


# -- the magic line ----------------------------------------------------------------------------------------------

def test_the_magic_line_takes_a_prompt_and_its_arguments() -> None:
    opts = parse_line("--prompt res:summarise --arg topic='the MCP spec' --arg style=terse")
    assert opts.mcp_prompt.server == "res" and opts.mcp_prompt.name == "summarise"  # type: ignore[attr-defined]
    assert opts.mcp_prompt.arguments == {"topic": "the MCP spec", "style": "terse"}  # type: ignore[attr-defined]
    assert opts.prompt == ""  # the request is the prompt's; no text of the cell's own
    withbody = parse_line("--prompt res:summarise --arg topic=x", "and answer in French")
    assert withbody.prompt == "and answer in French"
    assert not hasattr(parse_line("", "plain request"), "mcp_prompt")


@pytest.mark.parametrize(("line", "says"), [
    ("--prompt summarise", "is not server:name"),
    ("--prompt bad.server:x", "is not server:name"),
    ("--prompt res:", "is not server:name"),
    ("--prompt res:x --arg novalue", "is not NAME=VALUE"),
    ("--prompt res:x --arg a=1 --arg a=2", "given twice"),
    ("--arg a=1 hello", "give --prompt SERVER:NAME too"),
])
def test_a_bad_prompt_line_is_one_line(line: str, says: str) -> None:
    with pytest.raises(AgentUsageError) as info:
        parse_line(line)
    assert says in str(info.value) and "\n" not in str(info.value)


# -- the broker ---------------------------------------------------------------------------------------------------

async def _broker(tmp_path: Path, tools: set[str]) -> tuple[Broker, McpRegistry]:
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "data", consent_timeout=30))
    cfg = StdioServerConfig(name="res", command=sys.executable, args=[str(SERVER)])
    registry = McpRegistry(McpConfig(servers={"res": cfg}), broker.store, shutdown_grace=0.5)
    broker.mcp = registry
    if tools:
        broker.grants.issue(Grant(origin=KERNEL.origin, tools=frozenset(tools), models=frozenset({"*"}),
                                  consent_id="c"))
    broker.grants.issue(Grant(origin=OTHER.origin, tools=frozenset({"scratch_read"}), models=frozenset({"*"}),
                              consent_id="o"))
    async with asyncio.timeout(60):
        await registry.start()
    return broker, registry


async def _refused(broker: Broker, caller: Caller, method: str, params: dict[str, Any]) -> RelayError:
    with pytest.raises(RelayError) as info:
        await call_method(broker, caller, method, params)
    return info.value


@pytest.mark.asyncio
async def test_prompts_are_listed_and_fetched_for_a_notebook_whose_grant_reaches_the_server(tmp_path: Path) -> None:
    broker, registry = await _broker(tmp_path, {"res__read_resource"})
    try:
        listed = await call_method(broker, KERNEL, "mcp.prompts_list", {})
        assert listed["prompts"] == [{"server": "res", "name": "summarise", "description": "Summarise a topic",
                                      "arguments": [{"name": "topic", "description": "", "required": True}]}]
        assert (await call_method(broker, KERNEL, "mcp.prompts_list", {"server": "res"}))["prompts"] == listed["prompts"]
        got = await call_method(broker, KERNEL, "mcp.prompt_get",
                                {"server": "res", "name": "summarise", "arguments": {"topic": SECRET_TOPIC}})
        assert got["text"] == f"Please summarise {SECRET_TOPIC} in three lines."
        assert got["messages"] == [{"role": "user", "text": got["text"]}] and got["truncated"] is False

        # checked before anything is sent: the prompt's declared arguments
        missing = await _refused(broker, KERNEL, "mcp.prompt_get", {"server": "res", "name": "summarise"})
        assert missing.code == Code.INVALID_ARGUMENTS and "missing argument 'topic'" in missing.message
        unknown = await _refused(broker, KERNEL, "mcp.prompt_get", {"server": "res", "name": "summarise",
                                                                    "arguments": {"topic": "a", "extra": "b"}})
        assert unknown.code == Code.INVALID_ARGUMENTS and "unknown argument 'extra'" in unknown.message
        nope = await _refused(broker, KERNEL, "mcp.prompt_get", {"server": "res", "name": "nope"})
        assert nope.code == Code.NOT_FOUND and "its prompts: summarise" in nope.message
        ghost = await _refused(broker, KERNEL, "mcp.prompt_get", {"server": "ghost", "name": "x"})
        assert ghost.code == Code.NOT_FOUND
        huge = await _refused(broker, KERNEL, "mcp.prompt_get", {"server": "res", "name": "summarise",
                                                                 "arguments": {"topic": "x" * 9000}})
        assert huge.code == Code.INVALID_ARGUMENTS

        # a notebook whose grant reaches none of the server's tools gets neither its list nor its prompts
        assert (await call_method(broker, OTHER, "mcp.prompts_list", {}))["prompts"] == []
        outside = await _refused(broker, OTHER, "mcp.prompt_get", {"server": "res", "name": "summarise",
                                                                   "arguments": {"topic": "a"}})
        assert outside.code == Code.SCOPE_EXCEEDED and "grant allows no tool of the MCP server 'res'" in outside.message
        assert (await _refused(broker, OTHER, "mcp.prompts_list", {"server": "res"})).code == Code.SCOPE_EXCEEDED

        # audited: who, which prompt, the argument names; never a value
        records = [r for r in broker.audit.tail(100) if r.tool == "mcp.prompt_get"]
        ok = [r for r in records if r.decision == "ok"]
        assert len(ok) == 1 and ok[0].origin == KERNEL.origin and ok[0].answered_by == KERNEL.client_id
        assert ok[0].arguments["arguments"] == ["topic"] and ok[0].arguments["prompt"] == "summarise"
        assert any(r.decision == "error" for r in records)
        assert SECRET_TOPIC not in json.dumps([r.model_dump() for r in broker.audit.tail(1000)], default=str)
    finally:
        await registry.stop()
        broker.close()


@pytest.mark.asyncio
async def test_a_notebook_without_a_grant_gets_no_prompt(tmp_path: Path) -> None:
    broker, registry = await _broker(tmp_path, set())
    try:
        refused = await _refused(broker, KERNEL, "mcp.prompt_get", {"server": "res", "name": "summarise",
                                                                    "arguments": {"topic": "a"}})
        assert refused.code == Code.UNAUTHORIZED
        assert (await call_method(broker, KERNEL, "mcp.prompts_list", {}))["prompts"] == []
    finally:
        await registry.stop()
        broker.close()


EVERYTHING = HERE.parent / "peers" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"


@pytest.mark.peer
@pytest.mark.asyncio
async def test_server_everythings_prompts_with_and_without_arguments(tmp_path: Path) -> None:
    if not EVERYTHING.exists() or shutil.which("node") is None:
        pytest.skip("server-everything is not installed: make peers")
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "data", consent_timeout=30))
    cfg = StdioServerConfig(name="every", command="node", args=[str(EVERYTHING), "stdio"])
    registry = McpRegistry(McpConfig(servers={"every": cfg}), broker.store, shutdown_grace=0.5)
    broker.mcp = registry
    broker.grants.issue(Grant(origin=KERNEL.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    try:
        async with asyncio.timeout(60):
            await registry.start()
        listed = {p["name"]: p for p in (await call_method(broker, KERNEL, "mcp.prompts_list", {}))["prompts"]}
        simple = next(n for n in listed if "simple" in n)
        with_args = next(n for n in listed if listed[n]["arguments"] and any(a["required"] for a in listed[n]["arguments"]))
        got = await call_method(broker, KERNEL, "mcp.prompt_get", {"server": "every", "name": simple})
        assert got["text"].strip() and got["messages"][0]["role"] == "user"
        required = {a["name"]: "Paris" for a in listed[with_args]["arguments"] if a["required"]}
        got = await call_method(broker, KERNEL, "mcp.prompt_get",
                                {"server": "every", "name": with_args, "arguments": required})
        assert "Paris" in got["text"]
    finally:
        await registry.stop()
        broker.close()


# -- a real kernel ---------------------------------------------------------------------------------------------------

MODEL = "claude-fake-1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Any]]:
    sys.path.insert(0, str(HERE.parent))
    from kernel.conftest import execute
    from kernel.real_server import RealServer

    from relay_jupyter.testing import FakeAnthropic

    with FakeAnthropic(api_key="test-key") as fake:
        tmp = tmp_path_factory.mktemp("prompts")
        mcp_json = tmp / "mcp.json"
        mcp_json.write_text(json.dumps({"mcpServers": {"res": {"command": sys.executable, "args": [str(SERVER)]}}}))
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "default_model": MODEL,
                  "mcp_config_path": str(mcp_json)}
        with RealServer(tmp, config) as srv:
            kc = srv.kernel_for("prompts.ipynb")
            assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
            assert execute(kc, "relay.connect(['res__read_resource'])")[0]["status"] == "ok"
            yield srv, fake, kc


@pytest.mark.slow
def test_a_prompt_is_the_runs_request_and_the_cell_says_whose_text_it_is(stack: tuple[Any, Any, Any]) -> None:
    from kernel.conftest import execute, text_of

    from relay_jupyter.testing import Reply, text

    _srv, fake, kc = stack
    fake.enqueue(Reply(text("Three lines about it.")))
    reply, msgs = execute(kc, f"%%agent --prompt res:summarise --arg topic={SECRET_TOPIC} --model {MODEL}\n"
                              "Answer in French.", timeout=120)
    shown = text_of(msgs)
    assert reply["status"] == "ok", shown
    assert "request from the MCP server res's prompt summarise (its text, not relay's)" in shown
    assert f"│ Please summarise {SECRET_TOPIC} in three lines." in shown and "followed by this cell's text" in shown
    assert "Three lines about it." in shown
    sent = json.dumps(fake.requests[-1].body["messages"])
    assert f"Please summarise {SECRET_TOPIC} in three lines.\\n\\nAnswer in French." in sent

    # listed in the kernel; a wrong prompt fails the cell with one line and nothing reaches the model
    listing, lmsgs = execute(kc, "print(relay.prompts().to_dict('records'))")
    assert "'prompt': 'res:summarise'" in text_of(lmsgs) and "'arguments': 'topic'" in text_of(lmsgs)
    before = len(fake.requests)
    bad, bmsgs = execute(kc, f"%agent --prompt res:summarise --arg colour=red --model {MODEL}", timeout=60)
    assert bad["status"] == "error" and "unknown argument 'colour'" in text_of(bmsgs)
    assert "Traceback" not in text_of(bmsgs) and len(fake.requests) == before
