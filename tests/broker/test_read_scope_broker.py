"""Issue 11 items 2 and 3 through a real broker (durable store, runtime, workspace) with the fake
Anthropic server proposing the calls: pulls of every credential store, of the configured secrets file
and MCP config are refused and no secret byte reaches any request the fake receives; a pull outside the
notebook's directory waits for a card; pushes to every protected target — each Jupyter dir of
``jupyter --paths``, the MCP config under another name — are refused in ``full`` mode (no card, the
mode's blanket approval) and write nothing."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.broker.assembly import install_components, jupyter_dirs
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply, text, tool_use

KEY = "sk-ant-test-read-scope-0123456789"
NB = Caller(kind=CallerKind.KERNEL, origin="notebook:proj/nb.ipynb", client_id="kernel:k1")

CREDENTIALS = [
    ".ssh/id_rsa", ".ssh/id_ed25519", ".aws/credentials", ".gnupg/private-keys-v1.d/k.key",
    ".config/gcloud/application_default_credentials.json", ".azure/accessTokens.json", ".kube/config",
    ".docker/config.json", ".netrc", ".git-credentials", ".pypirc", ".npmrc", ".env", "proj/.env.local",
    "proj/tls/server.pem", "proj/api.key", "id_rsa", "backup/id_ed25519.bak", "id_ecdsa", "proj/vault.kdbx",
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A Jupyter root that is the user's home: credentials, Jupyter's own dirs, the relay config."""
    root = tmp_path / "home"
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "data.csv").write_text("a,b\n1,2\n")
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("NOTES-7c1e: outside the notebook's directory\n")
    secrets: dict[str, str] = {}
    for i, rel in enumerate(CREDENTIALS):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        secrets[rel] = f"SECRET-{i:02d}-{os.urandom(6).hex()}"
        (root / rel).write_text(secrets[rel] + "\n")
    keys = root / "relay-keys.toml"  # the configured secrets file, not named like a credential
    secrets["relay-keys.toml"] = f"SECRET-keys-{os.urandom(6).hex()}"
    keys.write_text(f'anthropic_api_key = "{secrets["relay-keys.toml"]}"\n')
    os.chmod(keys, 0o600)
    mcp = root / "tools" / "servers.json"  # the configured MCP config under another name
    mcp.parent.mkdir()
    secrets["tools/servers.json"] = f"SECRET-mcp-{os.urandom(6).hex()}"
    mcp.write_text(json.dumps({"mcpServers": {"x": {"command": "true", "env": {"TOKEN": secrets["tools/servers.json"]}}}}))
    # every Jupyter dir of this server inside the root, as JUPYTER_* moves them
    env = {"JUPYTER_CONFIG_DIR": root / ".jupyter", "JUPYTER_CONFIG_PATH": root / "etc" / "jupyter",
           "JUPYTER_DATA_DIR": root / ".local" / "share" / "jupyter", "JUPYTER_PATH": root / "share" / "jupyter",
           "JUPYTER_RUNTIME_DIR": root / ".local" / "share" / "jupyter" / "runtime"}
    for name, path in env.items():
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(name, str(path))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    return root, secrets, mcp, keys


def make(data: Path, mcp: Path, keys: Path, **extra) -> Broker:
    broker = Broker.open(BrokerConfig(data_dir=data, consent_timeout=20, default_model="claude-test-1",
                                      mcp_config_path=mcp, secrets_file=keys, secret_globs=("*.kdbx",), **extra))
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="click"))
    return broker


async def finish(broker: Broker, run_id: str) -> str:
    await asyncio.wait_for(broker.runs.wait(run_id), 60)
    return next(e.type for e in broker.store.events_since(0) if e.run_id == run_id and e.type in TERMINAL_EVENTS)


def tool_results(request) -> list[str]:
    out = []
    for message in request.body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "tool_result":
                out.append(json.dumps(block["content"]))
    return out


@pytest.mark.asyncio
async def test_pulls_of_credentials_secrets_file_and_mcp_config_are_refused_and_never_sent(tmp_path, home):
    root, secrets, mcp, keys = home
    broker = make(tmp_path / "relay", mcp, keys, read_roots=(".",))  # even with the whole root as a read root
    with FakeAnthropic(api_key=KEY) as fake:
        backend = AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",), timeout=10)
        install_components(broker, jupyter_root=root, backends={"anthropic": backend})
        try:
            calls = [tool_use("scratch_pull", {"source": rel, "path": f"p{i}"}) for i, rel in enumerate(secrets)]
            calls += [tool_use("scratch_read", {"path": f"p{i}"}) for i in range(len(secrets))]
            fake.enqueue(Reply(*calls), Reply(text("I could not read them")))
            run = await call_method(broker, NB, "run.start", {"conversation": "c1", "prompt": "read my keys"})
            assert await finish(broker, run["run_id"]) == EventType.DONE
            results = tool_results(fake.requests[-1])
            assert len(results) == 2 * len(secrets)
            for rel, result in zip(secrets, results[:len(secrets)]):
                assert "PATH_REFUSED" in result or "refused" in result, (rel, result)
            # not one byte of any secret in any request the model server received
            everything = json.dumps([r.body for r in fake.requests])
            for rel, value in secrets.items():
                assert value not in everything, rel
            asked = [e for e in broker.store.events_since(0) if e.type == EventType.PERMISSION_REQUEST]
            assert asked == []  # refused outright: no card offers to read a credential
        finally:
            broker.close()


async def _answer(broker: Broker, decision: str) -> dict:
    async with asyncio.timeout(30):
        while True:
            events = broker.store.events_since(0)
            answered = {e.data["request_id"] for e in events if e.type == EventType.PERMISSION_RESOLVED}
            pending = [e.data for e in events if e.type == EventType.PERMISSION_REQUEST
                       and e.data["request_id"] not in answered]
            if pending:
                await call_method(broker, NB, "permission.answer", {"request_id": pending[0]["request_id"],
                                                                     "decision": decision, "scope": "once"})
                return pending[0]
            await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_a_pull_outside_the_notebook_dir_shows_a_card(tmp_path, home):
    root, _secrets, mcp, keys = home
    broker = make(tmp_path / "relay", mcp, keys)
    with FakeAnthropic(api_key=KEY) as fake:
        backend = AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",), timeout=10)
        install_components(broker, jupyter_root=root, backends={"anthropic": backend})
        try:
            # under the notebook's directory: no card
            fake.enqueue(Reply(tool_use("scratch_pull", {"source": "proj/data.csv", "path": "d.csv"})), Reply(text("ok")))
            run = await call_method(broker, NB, "run.start", {"conversation": "c1", "prompt": "load"})
            assert await finish(broker, run["run_id"]) == EventType.DONE
            assert not [e for e in broker.store.events_since(0) if e.type == EventType.PERMISSION_REQUEST]
            assert "pulled proj/data.csv" in tool_results(fake.requests[-1])[0]

            # elsewhere: a card naming the file and the provider; denied, nothing is pulled
            fake.enqueue(Reply(tool_use("scratch_pull", {"source": "other/notes.txt", "path": "n.txt"})),
                         Reply(text("understood")))
            run = await call_method(broker, NB, "run.start", {"conversation": "c1", "prompt": "and that"})
            card = await _answer(broker, "deny")
            assert card["tool"] == "scratch_pull" and card["tool_class"] == "write"
            reasons = "\n".join(card["reasons"])
            assert "other/notes.txt" in reasons and "model provider" in reasons and "proj/" in reasons
            assert card["preview"]["source"] == "other/notes.txt" and "tool_class" not in card["preview"]
            assert await finish(broker, run["run_id"]) == EventType.DONE
            assert "NOTES-7c1e" not in json.dumps([r.body for r in fake.requests])  # denied: never read

            # approved once: pulled
            fake.enqueue(Reply(tool_use("scratch_pull", {"source": "other/notes.txt", "path": "n.txt"})),
                         Reply(text("done")))
            run = await call_method(broker, NB, "run.start", {"conversation": "c1", "prompt": "please"})
            await _answer(broker, "allow")
            assert await finish(broker, run["run_id"]) == EventType.DONE
            assert "pulled other/notes.txt" in tool_results(fake.requests[-1])[-1]
        finally:
            broker.close()


@pytest.mark.asyncio
async def test_approved_pushes_to_every_protected_target_are_refused_and_write_nothing(tmp_path, home):
    root, secrets, mcp, keys = home
    broker = make(root / "relaydata", mcp, keys)  # the relay data dir inside the root, as a target
    dirs = jupyter_dirs()
    inside = [d for kind in dirs.values() for d in kind if root in Path(d).resolve().parents]
    assert len(inside) >= 5  # config dir, config path, data dir, data path, runtime dir
    targets = [str((Path(d) / "jupyter_server_config.py").relative_to(root)) for d in inside]
    targets += ["tools/servers.json", "relay-keys.toml", ".git/hooks/pre-commit", "proj/.ipynb_checkpoints/x",
                "proj/mcp.json", ".ssh/authorized_keys", ".env", "relaydata/relay.db", "relaydata/new.txt"]
    with FakeAnthropic(api_key=KEY) as fake:
        backend = AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",), timeout=10)
        install_components(broker, jupyter_root=root, backends={"anthropic": backend})
        try:
            before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "relaydata" not in p.parts}
            calls = [tool_use("scratch_write", {"path": "evil.py", "content": "import os  # evil\n"})]
            calls += [tool_use("scratch_push", {"path": "evil.py", "target": t}) for t in targets]
            fake.enqueue(Reply(*calls), Reply(text("done")))
            run = await call_method(broker, NB, "run.start", {"conversation": "c1", "prompt": "configure",
                                                               "mode": "full"})
            assert await finish(broker, run["run_id"]) == EventType.DONE
            results = tool_results(fake.requests[-1])[1:]
            assert len(results) == len(targets)
            for target, result in zip(targets, results):
                assert "refused" in result and "pushed" not in result, (target, result)
            after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "relaydata" not in p.parts}
            assert not (root / "relaydata" / "new.txt").exists()
            assert after == before  # nothing written, nothing created
            assert broker.checkpoints.list() == []
        finally:
            broker.close()


def test_jupyter_dirs_follow_the_environment_and_drop_empty_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", f"{tmp_path / 'a'}::{tmp_path / 'b'}")
    monkeypatch.setenv("JUPYTER_PATH", f":{tmp_path / 'd'}")
    dirs = jupyter_dirs()
    assert tmp_path / "a" in dirs["config"] and tmp_path / "b" in dirs["config"]
    assert tmp_path / "d" in dirs["data"]
    assert all(str(p) not in ("", ".") for kind in dirs.values() for p in kind)
    assert Path.cwd() not in dirs["config"] + dirs["data"]
