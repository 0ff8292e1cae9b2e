"""The client side of the MCP conformance suite, through relay's own connection code.

    python -m relay_jupyter.testing.mcp_conformance <url>

``@modelcontextprotocol/conformance client --command "<this>"`` starts a scenario server, runs this
command with the server's URL and names the scenario in ``MCP_CONFORMANCE_SCENARIO``. The adapter
does what a notebook user's broker does, with the broker's real code (:class:`McpConnection` over
Streamable HTTP: the endpoint policy, the capped transport, the version check, elicitation): connect,
list the tools, call the tools the scenario names. It is a test driver, not a product path:

- an elicitation is answered the way a person submitting the card unchanged would (the form's
  defaults, as the card fills them in), which is what ``elicitation-sep1034-client-defaults`` checks;
  relay's checks (form mode, bounds, no credential fields) still apply;
- OAuth scenarios (``auth/*``) use the same connection, so they show what a user of such a server sees.

Exit 0 when every step worked, 1 otherwise (the suite judges by its own checks, not by the exit code).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..mcp.config import HttpServerConfig
from ..mcp.connection import McpConnection, McpToolError
from ..mcp.elicitation import ElicitationAnswer, ElicitationAsk, call_context

__all__ = ["main"]

# Per scenario: the tools to call and their arguments (the scenario servers' own tools).
_CALLS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "tools_call": [("add_numbers", {"a": 5, "b": 3})],
    "elicitation-sep1034-client-defaults": [("test_client_elicitation_defaults", {})],
    "sse-retry": [("test_reconnection", {})],
}


async def _answer_with_defaults(ask: ElicitationAsk) -> ElicitationAnswer:
    """A person pressing Submit on an unchanged card: accept with the form's defaults (what the card
    fills in). A question relay refused to show is declined, as in the notebook."""
    if ask.refused is not None:
        return ElicitationAnswer("decline", answered_by="relay")
    return ElicitationAnswer("accept", {f.name: f.default for f in ask.fields if f.default is not None},
                             answered_by="conformance")


class HeadlessSignIn:
    """The suite's authorization server approves at once: follow its authorization URL one hop (no
    redirect followed) and read the code from the redirect. Stands in for relay's (unbuilt) sign-in card."""

    redirect_uri = "http://localhost:3000/callback"

    def __init__(self) -> None:
        self._url: str | None = None

    async def redirect(self, server: str, authorization_url: str) -> None:
        self._url = authorization_url

    async def callback(self, server: str) -> Any:
        import urllib.parse

        import httpx2
        from mcp.shared.auth import AuthorizationCodeResult

        assert self._url is not None
        async with httpx2.AsyncClient(follow_redirects=False, trust_env=False) as client:
            response = await client.get(self._url)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(response.headers.get("location", "")).query)
        first = {k: v[0] for k, v in query.items()}
        return AuthorizationCodeResult(code=first.get("code", ""), state=first.get("state"), iss=first.get("iss"))


async def _issuer_of(url: str) -> str:
    """The authorization server the scenario's protected-resource metadata names. Stands in for the user, who writes
    the ``issuer`` of their machine client into mcp.json (the product never takes it from the MCP server)."""
    import urllib.parse

    import httpx2

    parts = urllib.parse.urlsplit(url)
    base = f"{parts.scheme}://{parts.netloc}"
    async with httpx2.AsyncClient(follow_redirects=False, trust_env=False) as client:
        for path in (f"/.well-known/oauth-protected-resource{parts.path}", "/.well-known/oauth-protected-resource"):
            response = await client.get(base + path)
            if response.status_code == 200:
                servers = response.json().get("authorization_servers") or []
                if servers:
                    return str(servers[0])
    return base


async def run(url: str, scenario: str) -> int:
    import tempfile

    from ..mcp.oauth import FileTokenStore, oauth_provider

    config = HttpServerConfig(name="conformance", url=url)
    connection = McpConnection(config, call_timeout=20.0, connect_timeout=20.0)
    tokens = tempfile.TemporaryDirectory(prefix="relay-conformance-oauth-")
    sign_in = HeadlessSignIn()
    connection.http_auth = lambda cfg: oauth_provider(cfg.name, cfg.url, FileTokenStore(Path(tokens.name), cfg.name,
                                                                                        cfg.url), sign_in)
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    if scenario == "auth/client-credentials-basic" and context.get("client_id") and context.get("client_secret"):
        # a machine client (mcp.json client_id + issuer, the secret in the secrets file): the product's provider
        # and in-memory token store, as the registry builds them (McpRegistry.enable_client_credentials)
        from ..mcp.oauth import MemoryTokenStore, client_credentials_provider

        issuer = await _issuer_of(url)
        store = MemoryTokenStore()
        connection.http_auth = lambda cfg: client_credentials_provider(
            cfg.url, store, client_id=context["client_id"], client_secret=context["client_secret"], issuer=issuer)
    elif scenario == "auth/client-credentials-jwt" and context.get("client_id") and context.get("private_key_pem"):
        # the same machine client authenticating with private_key_jwt (the PEM is its secrets-file entry)
        from ..mcp.oauth import MemoryTokenStore, client_credentials_provider

        issuer = await _issuer_of(url)
        store = MemoryTokenStore()
        connection.http_auth = lambda cfg: client_credentials_provider(
            cfg.url, store, client_id=context["client_id"], client_secret=context["private_key_pem"], issuer=issuer,
            token_auth="private_key_jwt", signing_algorithm=context.get("signing_algorithm") or "ES256")
    elif context.get("client_id") and context.get("client_secret"):
        # a client registered beforehand (the user pasted its id and secret): no dynamic registration
        from mcp.shared.auth import OAuthClientInformationFull

        await FileTokenStore(Path(tokens.name), config.name, config.url).set_client_info(OAuthClientInformationFull(
            client_id=context["client_id"], client_secret=context["client_secret"],
            redirect_uris=[sign_in.redirect_uri], token_endpoint_auth_method="client_secret_basic"))
    connection.elicitation_handler = _answer_with_defaults
    # every call runs for one "notebook", as the broker's calls do (an unattributed question is declined)
    notebook = SimpleNamespace(origin="conformance", originator="conformance", run_id=None)
    ok = True
    try:
        await connection.open()
        tools = await connection.list_tools()
        print(f"connected: protocol {connection.protocol_version}; tools: {[t.name for t in tools]}", flush=True)
        listed = {t.name for t in tools}
        for name, arguments in _CALLS.get(scenario, []):
            if name not in listed and scenario != "sse-retry":
                print(f"tool {name} not listed", flush=True)
                ok = False
                continue
            with call_context(notebook):
                result = await connection.call_tool(name, arguments)
            print(f"{name}: {json.dumps(result)[:500]}", flush=True)
            ok = ok and not result.get("is_error")
        if not _CALLS.get(scenario):
            # every other scenario (initialize, auth/*): one call of the first tool, as a run would
            for tool in tools[:1]:
                with call_context(notebook):
                    result = await connection.call_tool(tool.name, {})
                print(f"{tool.name}: {json.dumps(result)[:500]}", flush=True)
    except McpToolError as exc:
        print(f"relay: {exc.message}", flush=True)
        ok = False
    finally:
        await connection.close()
        tokens.cleanup()
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m relay_jupyter.testing.mcp_conformance <url>", file=sys.stderr)
        return 2
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    return asyncio.run(run(args[0], scenario))


if __name__ == "__main__":
    raise SystemExit(main())
