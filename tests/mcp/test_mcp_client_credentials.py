"""Machine-to-machine MCP servers: the OAuth ``client_credentials`` grant (issue 20 Deliver 2, the SDK's
``ClientCredentialsOAuthProvider``), against a local authorization server of our own on 127.0.0.1
(``oauth_mcp_server.ClientCredentialsMcpServer``: an MCP SDK server whose token verifier and token endpoint take
only its one client's id and secret).

mcp.json names ``client_id`` and ``issuer``; the secret is only in the relay secrets file (0600). The broker's
registry (built as the broker builds it, ``broker/assembly._mcp_registry``) gets a token without a person, lists
and calls the tool; the secret and the token appear in no status, event, audit record, log line or file of the
data dir; a wrong or missing secret, an unsafe secrets file and a server pointing at another issuer fail that
server with one line; a secret written into mcp.json is refused without being echoed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import pytest
from oauth_mcp_server import ClientCredentialsMcpServer

from relay_jupyter.broker.assembly import _mcp_registry
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.mcp.config import parse_config

CLIENT_ID = "relay-bot"
SECRET = "cc-secret-5f1e9a7b"


@pytest.fixture
def cc_server():
    with ClientCredentialsMcpServer(CLIENT_ID, SECRET) as srv:
        yield srv


def _write(path: Path, data: object, mode: int = 0o600) -> Path:
    path.write_text(json.dumps(data))
    os.chmod(path, mode)
    return path


def _broker(tmp_path: Path, entry: dict, secrets: dict | None) -> Broker:
    mcp_json = _write(tmp_path / "mcp.json", {"mcpServers": {"m2m": entry}})
    secrets_file = _write(tmp_path / "secrets.json", secrets) if secrets is not None else None
    return Broker.open(BrokerConfig(data_dir=tmp_path / "data", mcp_config_path=mcp_json, secrets_file=secrets_file))


def _entry(srv: ClientCredentialsMcpServer, **extra: str) -> dict:
    return {"url": srv.url, "client_id": CLIENT_ID, "issuer": srv.issuer, **extra}


@pytest.mark.parametrize("token_auth", [None, "client_secret_post"])
async def test_a_machine_client_gets_its_token_without_a_person(
        cc_server: ClientCredentialsMcpServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        token_auth: str | None) -> None:
    caplog.set_level(logging.DEBUG)
    extra = {"token_auth": token_auth} if token_auth else {}
    broker = _broker(tmp_path, _entry(cc_server, scope="mcp", **extra), {"mcp.m2m": SECRET})
    registry = _mcp_registry(broker)
    try:
        async with asyncio.timeout(60):
            await registry.start()
            [status] = registry.status()
            assert (status.state, status.tools) == ("connected", 1), status
            result = await registry.call("m2m__whoami", {})
            assert result["content"] == "machine client" and cc_server.calls == ["whoami"]
            # one token, reused by the reconnect (kept in memory for the registry's life)
            await registry.disconnect("m2m")
            await registry.refresh("m2m")
            assert registry.status()[0].state == "connected"
        assert cc_server.auth.tokens_issued == 1 and cc_server.auth.refused == 0
        assert cc_server.auth.auth_methods == [token_auth or "client_secret_basic"]
        assert cc_server.auth.scopes == ["mcp"]
        # not a person's sign-in: the side panel's list does not offer it
        assert registry.sign_ins() == []
        token = next(iter(cc_server.auth.access))
        shown = json.dumps([s.__dict__ for s in registry.status()], default=str) + repr(registry.config)
        logs = "\n".join(r.getMessage() for r in caplog.records)
        events = json.dumps([e.data for e in broker.store.events_since(0)])
        files = "".join(p.read_text(errors="replace") for p in (tmp_path / "data").rglob("*") if p.is_file())
        for secret in (SECRET, token):
            assert secret not in shown and secret not in logs and secret not in events and secret not in files
    finally:
        await registry.stop()
        broker.close()


@pytest.mark.parametrize("case", ["wrong secret", "no entry", "no secrets file", "unsafe secrets file",
                                  "another issuer"])
async def test_a_machine_client_that_cannot_get_a_token_fails_with_one_line(
        cc_server: ClientCredentialsMcpServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str) -> None:
    caplog.set_level(logging.DEBUG)
    entry, secrets, mode = _entry(cc_server), {"mcp.m2m": SECRET}, 0o600
    if case == "wrong secret":
        secrets = {"mcp.m2m": "not-" + SECRET}
    elif case == "no entry":
        secrets = {"mcp.other": SECRET}
    elif case == "no secrets file":
        secrets = None
    elif case == "unsafe secrets file":
        mode = 0o644
    else:  # the client's secret belongs to another authorization server: it must never be sent to this one
        entry = _entry(cc_server, issuer="https://auth.example.com")
    broker = _broker(tmp_path, entry, secrets)
    if mode != 0o600:  # the broker refuses such a file at start; this one was made readable after it started
        os.chmod(tmp_path / "secrets.json", mode)
    registry = _mcp_registry(broker)
    try:
        async with asyncio.timeout(60):
            await registry.start()
        [status] = registry.status()
        assert status.state == "failed" and status.tools == 0, status
        error = status.error or ""
        assert "\n" not in error and "Traceback" not in error and "m2m" in error, error
        assert "could not be reached" not in error, error
        if case in ("no entry", "no secrets file"):
            assert "has no entry 'mcp.m2m'" in error, error
        if case == "unsafe secrets file":
            assert "chmod 600" in error, error
        assert cc_server.calls == [] and cc_server.auth.tokens_issued == 0
        # the secret reached no token endpoint but its own: only a wrong one was ever presented
        assert cc_server.auth.refused == (1 if case == "wrong secret" else 0)
        logs = "\n".join(r.getMessage() for r in caplog.records)
        assert SECRET not in error and SECRET not in logs
    finally:
        await registry.stop()
        broker.close()


def test_mcp_json_holds_no_client_secret_and_names_its_issuer() -> None:
    def problem(entry: dict) -> str:
        return parse_config(json.dumps({"mcpServers": {"m2m": entry}})).problems.get("m2m", "")

    url = "https://mcp.example.com/mcp"
    refused = problem({"url": url, "client_id": CLIENT_ID, "issuer": "https://auth.example.com",
                       "client_secret": SECRET})
    assert "secrets file" in refused and "mcp.m2m" in refused and SECRET not in refused
    assert "needs 'issuer'" in problem({"url": url, "client_id": CLIENT_ID})
    assert "only with 'client_id'" in problem({"url": url, "scope": "mcp"})
    assert "plain http" in problem({"url": url, "client_id": CLIENT_ID, "issuer": "http://auth.example.com"})
    assert "one way" in problem({"url": url, "client_id": CLIENT_ID, "issuer": "https://a.example.com",
                                 "headers": {"Authorization": "Bearer x"}})
    assert "token_auth" in problem({"url": url, "client_id": CLIENT_ID, "issuer": "https://a.example.com",
                                    "token_auth": "client_secret_jwt"})
    assert "signing_algorithm" in problem({"url": url, "client_id": CLIENT_ID, "issuer": "https://a.example.com",
                                           "signing_algorithm": "ES256"})
    assert "signing_algorithm" in problem({"url": url, "client_id": CLIENT_ID, "issuer": "https://a.example.com",
                                           "token_auth": "private_key_jwt", "signing_algorithm": "none"})
    ok = parse_config(json.dumps({"mcpServers": {"m2m": {"url": url, "client_id": CLIENT_ID,
                                                         "issuer": "https://a.example.com",
                                                         "client_secret_entry": "team.bot"}}}))
    assert ok.problems == {} and ok.servers["m2m"].secret_entry == "team.bot"


def _ec_key() -> tuple[str, object]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return pem, key.public_key()


@pytest.mark.parametrize("case", ["its key", "another key", "not a key"])
async def test_a_machine_client_signs_its_token_request_with_its_private_key(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str) -> None:
    caplog.set_level(logging.DEBUG)
    pem, public = _ec_key()
    given = {"its key": pem, "another key": _ec_key()[0], "not a key": "-----BEGIN PRIVATE KEY-----\nnope\n"}[case]
    with ClientCredentialsMcpServer(CLIENT_ID, "unused-" + SECRET, public_key=public) as srv:
        broker = _broker(tmp_path, _entry(srv, token_auth="private_key_jwt", signing_algorithm="ES256"),
                         {"mcp.m2m": given})
        registry = _mcp_registry(broker)
        try:
            async with asyncio.timeout(60):
                await registry.start()
                [status] = registry.status()
                if case == "its key":
                    assert (status.state, status.tools) == ("connected", 1), status
                    assert (await registry.call("m2m__whoami", {}))["content"] == "machine client"
                    assert srv.auth.tokens_issued == 1 and srv.auth.auth_methods == ["private_key_jwt"]
                else:
                    assert status.state == "failed" and srv.auth.tokens_issued == 0, status
                    error = status.error or ""
                    assert "client_credentials grant failed" in error and "\n" not in error, error
                    if case == "another key":
                        assert srv.auth.refused == 1 and "invalid_client" in error, error
                    else:
                        assert "cannot sign" in error and srv.auth.refused == 0, error
            logs = "\n".join(r.getMessage() for r in caplog.records)
            shown = json.dumps([s.__dict__ for s in registry.status()], default=str)
            body = given.splitlines()[1]  # a line of the key's base64 (or the garbage)
            assert body not in logs and body not in shown
        finally:
            await registry.stop()
            broker.close()


def test_tools_list_connects_a_machine_client_with_the_secrets_file_of_the_jupyter_config(
        cc_server: ClientCredentialsMcpServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from relay_jupyter.cli import main

    config = tmp_path / "config"
    config.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    secrets_file = _write(tmp_path / "secrets.json", {"mcp.m2m": SECRET})
    (config / "jupyter_server_config.json").write_text(json.dumps({"RelayApp": {"secrets_file": str(secrets_file)}}))
    (config / "mcp.json").write_text(json.dumps({"mcpServers": {"m2m": _entry(cc_server)}}))
    assert main(["tools", "list", "--json"]) == 0
    out = capsys.readouterr().out
    listed = json.loads(out)
    [server] = listed["servers"]
    assert (server["name"], server["state"], server["tools"]) == ("m2m", "connected", 1), server
    assert SECRET not in out and not any(t in out for t in cc_server.auth.access)
