"""The real ``claude`` CLI as an *outside* MCP client of relay's gateway (issue 20, Tests): configured with
``{base_url}relay/mcp`` and a ``jupyter relay mcp-token --notebook PATH`` token — what ``claude mcp add --transport
http relay <url> --header "Authorization: Bearer <token>"`` writes — it calls a gated write tool; relay's card is
answered over the Jupyter server's RPC as the side panel does (a browser session). Deny: nothing written, the CLI
reads the refusal; Allow: written. The CLI's own ``--allowedTools`` pre-approval does not get past relay's gate.

Real parts: a Jupyter server with relay (subprocess), the shipped test MCP server (stdio) in its mcp.json, the
CLI bundled in the claude-agent-sdk wheel (quiet environment) talking to the shipped ``FakeAnthropic``. ``peer``;
only inside a network namespace with loopback only (``make test-claude-code``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hypothesis  # noqa: F401  (see tests/runtime/claude_code_rig.py: an end-of-session SystemError)
import pytest

from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel.real_server import RealServer  # noqa: E402
from runtime.claude_code_rig import ONLY_ISOLATED  # noqa: E402

claude_agent_sdk = pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.slow, ONLY_ISOLATED]

KEY = "sk-ant-fake-outside-cli-0123456789"
MODEL = "claude-fake-1"
NOTEBOOK = "gw.ipynb"
TOOL = "mcp__relay__t__write_note"  # the CLI's name for relay's t__write_note (server "relay")


def _cli(srv: RealServer, home: Path, config: Path, prompt: str) -> subprocess.Popen[str]:
    cli = str(Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    env.update(ANTHROPIC_BASE_URL=srv.fake_url, ANTHROPIC_API_KEY=KEY)  # type: ignore[attr-defined]
    return subprocess.Popen([cli, "-p", prompt, "--model", MODEL, "--output-format", "json", "--max-turns", "4",
                             "--mcp-config", str(config), "--strict-mcp-config", "--allowedTools", TOOL],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rpc(srv: RealServer, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return srv.api("POST", "relay/rpc", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})


def _card(srv: RealServer, proc: subprocess.Popen[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        pending = _rpc(srv, "permission.pending", {})["result"]["requests"]
        if pending:
            assert len(pending) == 1, pending
            return pending[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("no permission request")


def test_the_claude_cli_through_the_gateway_gets_relays_card(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    with FakeAnthropic(api_key=KEY, default=Reply("(fake) nothing scripted")) as fake:
        mcp_json = tmp_path / "mcp.json"
        mcp_json.write_text(json.dumps({"mcpServers": {"t": {
            "command": sys.executable, "args": ["-m", "relay_jupyter.testing.mcp_server", "--dir", str(notes)]}}}))
        srv = RealServer(tmp_path / "jp", {"in_memory": False, "mcp_config_path": str(mcp_json)})
        # the notebook's grant and the outside client's token, made at the terminal before the server starts
        for args in (("grants", "add", f"notebook:{NOTEBOOK}", "--tools", "t__echo,t__write_note", "--models", "*"),
                     ("mcp-token", "--notebook", NOTEBOOK, "--label", "claude")):
            done = subprocess.run([sys.executable, "-m", "relay_jupyter.cli", *args], env=srv.env(),
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        secret = next(w for line in done.stdout.splitlines() for w in line.split() if w.startswith("relay-mcp-"))
        with srv:
            srv.fake_url = fake.base_url  # type: ignore[attr-defined]
            url = srv.url + "relay/mcp"
            config = tmp_path / "claude-mcp.json"  # what `claude mcp add --transport http relay ...` records
            config.write_text(json.dumps({"mcpServers": {"relay": {
                "type": "http", "url": url, "headers": {"Authorization": f"Bearer {secret}"}}}}))
            home = tmp_path / "home"
            home.mkdir()
            deadline = time.monotonic() + 60  # the server connects its MCP servers in the background
            while "t__write_note" not in json.dumps(_rpc(srv, "tools.list", {"origin": f"notebook:{NOTEBOOK}"})):
                assert time.monotonic() < deadline
                time.sleep(0.2)

            for decision, body in (("deny", "no"), ("allow", "yes")):
                fake.enqueue(Reply(tool_use(TOOL, {"path": "cli.txt", "text": body})), Reply(text(f"done: {decision}")))
                proc = _cli(srv, home, config, "write the note")
                card = _card(srv, proc)
                assert card["tool"] == "t__write_note" and card["origin"] == f"notebook:{NOTEBOOK}"
                assert card["arguments"] == {"path": "cli.txt", "text": body}
                assert not (notes / "cli.txt").exists() or decision == "allow"
                answered = _rpc(srv, "permission.answer", {"request_id": card["request_id"], "decision": decision})
                assert answered["result"]["decision"] == decision, answered
                out, err = proc.communicate(timeout=180)
                assert proc.returncode == 0, (out[-2000:], err[-2000:])
                assert json.loads(out)["result"] == f"done: {decision}"
                # what the CLI sent back to the model as the tool's result
                results = [b for m in fake.requests[-1].body["messages"] for b in
                           (m["content"] if isinstance(m["content"], list) else []) if b.get("type") == "tool_result"]
                said = json.dumps(results)
                if decision == "deny":
                    assert "refused (CONSENT_DENIED)" in said and not (notes / "cli.txt").exists()
                else:
                    assert "refused" not in said and (notes / "cli.txt").read_text() == "yes"

            audit = _rpc(srv, "audit.tail", {"n": 200, "origin": f"notebook:{NOTEBOOK}"})["result"]
            calls = [r for r in json.loads(json.dumps(audit)).get("records", [])
                     if str(r.get("call_id") or "").startswith("mcpgw_") and r.get("tool") == "t__write_note"]
            assert [r["decision"] for r in calls][-2:] == ["deny", "allow"], calls
        log = (tmp_path / "jp" / "server.log").read_text(errors="replace")
        assert secret not in log and secret[10:30] not in log
