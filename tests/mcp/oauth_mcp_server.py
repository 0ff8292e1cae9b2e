"""An OAuth-protected Streamable HTTP MCP server on 127.0.0.1, for the sign-in tests (no network).

The MCP SDK's own server auth (``mcp.server.auth``: protected-resource and authorization-server metadata,
dynamic client registration, authorize, token, PKCE checked by the SDK) over a small in-memory provider
written here. Its authorization page approves at once, as a person clicking "Allow" would: it redirects
to the client's ``redirect_uri`` with the code and the state; with ``consent_page=True`` it shows a real
consent page instead (``/consent``: the client's name and an Allow / Deny form a browser test clicks).
Counts what happened so a test can assert on it (``registered``, ``authorized``, ``tokens_issued``, ``calls``).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from typing import Any

import anyio
from mcp.server.auth.provider import AccessToken, AuthorizationCode, AuthorizationParams, RefreshToken, construct_redirect_uri
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from mcp.types import ToolAnnotations
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from relay_jupyter.testing.mcp_server import _bind_loopback, _uvicorn_server


class MemoryProvider:
    """``OAuthAuthorizationServerProvider`` in memory; approves every authorization request at once."""

    def __init__(self) -> None:
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.registered = 0
        self.authorized = 0
        self.tokens_issued = 0
        self.deny_next = False
        self.consent_base: str | None = None
        """Set (``http://127.0.0.1:PORT``): authorize sends the browser to the consent page instead of approving."""
        self.consents: dict[str, tuple[OAuthClientInformationFull, AuthorizationParams]] = {}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.registered += 1
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        if self.consent_base is not None:
            request = secrets.token_urlsafe(12)
            self.consents[request] = (client, params)
            return f"{self.consent_base}/consent?request={request}"
        return self.decide(client, params)

    def decide(self, client: OAuthClientInformationFull, params: AuthorizationParams, allow: bool = True) -> str:
        """The redirect back to the client: a code (approved) or ``access_denied``."""
        self.authorized += 1
        if not allow:
            return construct_redirect_uri(str(params.redirect_uri), error="access_denied", state=params.state)
        if self.deny_next:
            self.deny_next = False
            return construct_redirect_uri(str(params.redirect_uri), error="access_denied", state=params.state)
        code = "code-" + secrets.token_urlsafe(16)
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or ["mcp"], expires_at=time.time() + 300, client_id=client.client_id,
            code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly, resource=params.resource)
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, authorization_code: str):
        found = self.codes.get(authorization_code)
        return found if found is not None and found.client_id == client.client_id else None

    async def exchange_authorization_code(self, client: OAuthClientInformationFull,
                                         authorization_code: AuthorizationCode) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str):
        found = self.refresh.get(refresh_token)
        return found if found is not None and found.client_id == client.client_id else None

    async def exchange_refresh_token(self, client: OAuthClientInformationFull, refresh_token: RefreshToken,
                                     scopes: list[str]) -> OAuthToken:
        self.refresh.pop(refresh_token.token, None)
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def verify_token(self, token: str) -> AccessToken | None:
        return await self.load_access_token(token)

    async def revoke_token(self, token: Any) -> None:
        self.access.pop(getattr(token, "token", ""), None)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        self.tokens_issued += 1
        access, refresh = "at-" + secrets.token_urlsafe(24), "rt-" + secrets.token_urlsafe(24)
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes,
                                          expires_at=int(time.time()) + 3600, resource=resource)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=3600, refresh_token=refresh,
                          scope=" ".join(scopes))


class OAuthMcpServer:
    """``with OAuthMcpServer() as srv: srv.url`` — an MCP server that answers 401 until signed in."""

    def __init__(self, *, consent_page: bool = False) -> None:
        self.provider = MemoryProvider()
        self.consent_page = consent_page
        self.calls: list[str] = []
        self._thread: threading.Thread | None = None
        self._uvicorn: Any = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _server(self) -> MCPServer:
        base = f"http://127.0.0.1:{self.port}"
        server = MCPServer(
            "oauth-test", auth_server_provider=self.provider,
            auth=AuthSettings(issuer_url=base, resource_server_url=f"{base}/mcp", validate_token_resource=False,
                              client_registration_options=ClientRegistrationOptions(
                                  enabled=True, valid_scopes=["mcp"], default_scopes=["mcp"]),
                              required_scopes=["mcp"]))

        @server.custom_route("/consent", methods=["GET", "POST"])
        async def consent(request: Request) -> Response:
            if request.method == "GET":
                rid = request.query_params.get("request", "")
                found = self.provider.consents.get(rid)
                if found is None:
                    return HTMLResponse("unknown request", status_code=400)
                name = found[0].client_name or found[0].client_id
                return HTMLResponse(
                    "<!doctype html><title>Authorize</title><h1>oauth-test authorization server</h1>"
                    f"<p>Allow <b id=client></b> to use the MCP server?</p><form method=post>"
                    f"<input type=hidden name=request value='{rid}'>"
                    "<button name=decision value=allow>Allow</button> <button name=decision value=deny>Deny</button>"
                    f"</form><script>document.getElementById('client').textContent = {json.dumps(name)}</script>")
            form = await request.form()
            found = self.provider.consents.pop(str(form.get("request", "")), None)
            if found is None:
                return HTMLResponse("unknown request", status_code=400)
            return RedirectResponse(self.provider.decide(*found, allow=form.get("decision") == "allow"),
                                    status_code=303)

        @server.tool(annotations=ToolAnnotations(read_only_hint=True))
        def whoami() -> str:
            self.calls.append("whoami")
            return "signed in"

        return server

    def __enter__(self) -> OAuthMcpServer:
        sock = _bind_loopback(0)
        self.port = sock.getsockname()[1]
        if self.consent_page:
            self.provider.consent_base = f"http://127.0.0.1:{self.port}"
        self._uvicorn = _uvicorn_server(self._server(), "warning")
        failure: list[BaseException] = []

        def run() -> None:
            try:
                anyio.run(lambda: self._uvicorn.serve(sockets=[sock]))
            except BaseException as exc:  # noqa: BLE001 - reported below
                failure.append(exc)
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="OAuthMcpServer", daemon=True)
        self._thread.start()
        self._uvicorn.ready.wait(timeout=20)
        if not self._uvicorn.started:
            self.__exit__()
            raise RuntimeError(f"OAuth test MCP server did not start: {failure[0] if failure else 'timeout'}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._uvicorn.should_exit = True
            self._thread.join(timeout=10)
            self._thread = None


class ClientCredentialsAuth:
    """A machine-to-machine authorization server (``client_credentials``, RFC 6749 §4.4) in memory: one client
    (``client_id`` / ``client_secret``), authenticated with ``client_secret_basic`` or ``client_secret_post``;
    also the MCP server's token verifier. The MCP SDK's server auth has no ``client_credentials`` grant, so the
    token endpoint is written here (a few lines of the RFC)."""

    def __init__(self, client_id: str, client_secret: str, public_key: Any = None) -> None:
        self.client_id, self.client_secret = client_id, client_secret
        self.public_key = public_key
        """Set: the client authenticates with ``private_key_jwt`` (RFC 7523), an assertion this key verifies."""
        self.access: dict[str, AccessToken] = {}
        self.tokens_issued = 0
        self.refused = 0
        self.auth_methods: list[str] = []
        self.scopes: list[str | None] = []

    async def verify_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        return found if found is not None and (found.expires_at or 0) >= time.time() else None

    async def token(self, request: Request) -> Response:
        import base64
        from urllib.parse import unquote

        form = await request.form()
        given_id, given_secret, method = form.get("client_id"), form.get("client_secret"), "client_secret_post"
        header = request.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            try:
                raw_id, _, raw_secret = base64.b64decode(header[6:]).decode().partition(":")
            except ValueError:
                raw_id = raw_secret = ""
            given_id, given_secret, method = unquote(raw_id), unquote(raw_secret), "client_secret_basic"
        if form.get("grant_type") != "client_credentials":
            return _json({"error": "unsupported_grant_type"}, 400)
        if self.public_key is not None:  # private_key_jwt: iss = sub = client_id, aud = this issuer, signed
            import jwt

            try:
                claims = jwt.decode(str(form.get("client_assertion") or ""), self.public_key,
                                    algorithms=["ES256", "RS256"], audience=str(request.base_url).rstrip("/"))
                ok = (form.get("client_assertion_type") == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
                      and claims.get("iss") == claims.get("sub") == self.client_id)
            except jwt.PyJWTError:
                ok = False
            given_id, given_secret, method = (self.client_id, self.client_secret, "private_key_jwt") if ok else (
                "", "", "private_key_jwt")
        if not (secrets.compare_digest(str(given_id or ""), self.client_id)
                and secrets.compare_digest(str(given_secret or ""), self.client_secret)):
            self.refused += 1
            return _json({"error": "invalid_client"}, 401)
        self.tokens_issued += 1
        self.auth_methods.append(method)
        self.scopes.append(form.get("scope"))  # type: ignore[arg-type]
        access = "cc-" + secrets.token_urlsafe(24)
        self.access[access] = AccessToken(token=access, client_id=self.client_id, scopes=["mcp"],
                                          expires_at=int(time.time()) + 3600)
        return _json({"access_token": access, "token_type": "Bearer", "expires_in": 3600, "scope": "mcp"}, 200)


def _json(body: dict[str, Any], status: int) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


class ClientCredentialsMcpServer(OAuthMcpServer):
    """``with ClientCredentialsMcpServer("bot", "s3cret") as srv`` — an MCP server that answers 401 until the client
    presents a token from the ``client_credentials`` grant of the authorization server at ``srv.issuer`` (the
    same port: ``/.well-known/oauth-authorization-server``, ``/token``). No person, no registration."""

    def __init__(self, client_id: str, client_secret: str, *, public_key: Any = None) -> None:
        super().__init__()
        self.auth = ClientCredentialsAuth(client_id, client_secret, public_key)

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _server(self) -> MCPServer:
        base = self.issuer
        server = MCPServer(
            "cc-test", token_verifier=self.auth,
            auth=AuthSettings(issuer_url=base, resource_server_url=f"{base}/mcp", validate_token_resource=False,
                              required_scopes=["mcp"]))

        @server.custom_route("/.well-known/oauth-authorization-server", methods=["GET"])
        async def metadata(request: Request) -> Response:
            return _json({"issuer": base, "token_endpoint": f"{base}/token", "response_types_supported": ["token"],
                          "authorization_endpoint": f"{base}/authorize",  # required by the SDK's model; unused
                          "grant_types_supported": ["client_credentials"],
                          "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post",
                                                                    "private_key_jwt"]},
                         200)

        server.custom_route("/token", methods=["POST"])(self.auth.token)

        @server.tool(annotations=ToolAnnotations(read_only_hint=True))
        def whoami() -> str:
            self.calls.append("whoami")
            return "machine client"

        return server
