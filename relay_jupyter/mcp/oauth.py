"""OAuth for Streamable HTTP MCP servers: the MCP SDK's client auth, with tokens kept by the broker only.

The SDK's :class:`~mcp.client.auth.OAuthClientProvider` does the protocol (protected-resource and
authorization-server metadata discovery, dynamic client registration, authorization code with PKCE,
the ``resource`` parameter, token refresh, scope step-up). relay adds:

- :class:`FileTokenStore`: tokens and the registered client kept in **one 0600 file per server** in
  the broker's secrets area (``<data dir>/mcp-oauth/``, directory 0700), written atomically; never in
  an event, the audit, a log line, a message or the kernel. The file is keyed by the server's name
  and URL: a changed URL never gets the old server's token.
- :class:`SignIn`: who completes the authorization step. The SDK gives the authorization URL; a
  ``SignIn`` gets the user through it and returns the code. relay's notebook sign-in card and its
  redirect handler in the Jupyter server are **not built yet**; without a ``SignIn`` an OAuth server
  is reported "needs authorisation" (``connection._auth_message``). The conformance adapter uses a
  headless ``SignIn`` against the suite's own authorization server.

Every request of the flow (metadata, registration, token) goes through the same policy transport as
MCP traffic (``mcp/http.py``): https, or http to loopback only, no redirects followed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Protocol

from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

__all__ = ["FileTokenStore", "MemoryTokenStore", "SignIn", "client_credentials_provider", "oauth_provider"]

REDIRECT_PATH = "relay/mcp-oauth/callback"


class SignIn(Protocol):
    """Gets the user through the authorization URL; returns the redirect's code (and state, iss)."""

    async def redirect(self, server: str, authorization_url: str) -> None: ...
    async def callback(self, server: str) -> AuthorizationCodeResult: ...

    @property
    def redirect_uri(self) -> str: ...


class FileTokenStore:
    """The SDK's ``TokenStorage`` over one 0600 JSON file per (server name, URL)."""

    def __init__(self, directory: Path, server: str, url: str) -> None:
        self.directory = Path(directory)
        key = hashlib.sha256(f"{server}\n{url}".encode()).hexdigest()[:32]
        self.path = self.directory / f"{key}.json"

    def _read(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, Any]) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(data).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    async def get_tokens(self) -> OAuthToken | None:
        raw = self._read().get("tokens")
        return OAuthToken.model_validate(raw) if raw else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._write({**self._read(), "tokens": tokens.model_dump(mode="json", exclude_none=True)})

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        raw = self._read().get("client")
        return OAuthClientInformationFull.model_validate(raw) if raw else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._write({**self._read(), "client": client_info.model_dump(mode="json", exclude_none=True)})

    def has_tokens(self) -> bool:
        """Whether tokens are stored (their values are never shown)."""
        return bool(self._read().get("tokens"))

    def forget_client_unless(self, redirect_uri: str) -> bool:
        """Drop a stored client registration whose redirect URIs do not include ``redirect_uri`` (a sign-in from
        another place: the terminal's loopback listener, the Jupyter server's route), with the tokens issued to
        it, so the SDK registers again. True when one was dropped."""
        data = self._read()
        client = data.get("client")
        uris = client.get("redirect_uris") if isinstance(client, dict) else None
        if not isinstance(client, dict) or (isinstance(uris, list) and redirect_uri in uris):
            return False
        self._write({})
        return True

    def forget(self) -> bool:
        """Sign out: delete the server's tokens and client registration."""
        try:
            self.path.unlink()
            return True
        except FileNotFoundError:
            return False

    def __repr__(self) -> str:
        return f"FileTokenStore({self.path.name})"


def oauth_provider(server: str, url: str, store: FileTokenStore, sign_in: SignIn, *,
                   scope: str | None = None) -> OAuthClientProvider:
    """The SDK's OAuth provider for one server, registering relay as a public native client."""
    metadata = OAuthClientMetadata(client_name="relay-jupyter", redirect_uris=[sign_in.redirect_uri],
                                   grant_types=["authorization_code", "refresh_token"],
                                   response_types=["code"], scope=scope)

    async def redirect(authorization_url: str) -> None:
        await sign_in.redirect(server, authorization_url)

    async def callback() -> AuthorizationCodeResult:
        return await sign_in.callback(server)

    return OAuthClientProvider(server_url=url, client_metadata=metadata, storage=store,
                               redirect_handler=redirect, callback_handler=callback)


class MemoryTokenStore:
    """The SDK's ``TokenStorage`` in memory: a machine client's tokens (``client_credentials``) are not kept on disk;
    the broker gets a new one with the client secret after a restart."""

    def __init__(self) -> None:
        self._tokens: OAuthToken | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self._tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return None  # the provider holds the configured client; nothing is registered

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        return None  # never stored: it would carry the client secret

    def __repr__(self) -> str:
        return "MemoryTokenStore(<hidden>)"


def client_credentials_provider(url: str, store: Any, *, client_id: str, client_secret: str, issuer: str,
                                scope: str | None = None, token_auth: str | None = None,
                                signing_algorithm: str | None = None) -> OAuthClientProvider:
    """The SDK's ``client_credentials`` provider (RFC 6749 §4.4: a machine client, no person; the client authenticates
    with its secret, or with ``token_auth="private_key_jwt"`` a JWT signed by the PEM key passed as ``client_secret``,
    RFC 7523): tokens only from the
    authorization server whose metadata's ``issuer`` is exactly ``issuer`` (the SDK stops the flow otherwise, so a
    server cannot send the client secret to an authorization server of its choosing)."""
    from mcp.client.auth.extensions.client_credentials import (
        ClientCredentialsOAuthProvider,
        PrivateKeyJWTOAuthProvider,
        SignedJWTParameters,
    )

    method = token_auth or "client_secret_basic"
    if method == "private_key_jwt":  # client_secret is the PEM private key; the SDK signs a short-lived assertion
        from mcp.client.auth.exceptions import OAuthFlowError

        signer = SignedJWTParameters(issuer=client_id, subject=client_id, signing_key=client_secret,
                                     signing_algorithm=signing_algorithm or "ES256")
        sign = signer.create_assertion_provider()

        async def assertion(audience: str) -> str:
            try:
                return await sign(audience)
            except Exception as exc:  # a key that is not a PEM of that algorithm: one line, never the key
                raise OAuthFlowError(f"the private key in the secrets file cannot sign a "
                                     f"{signing_algorithm or 'ES256'} assertion ({type(exc).__name__})") from None

        return PrivateKeyJWTOAuthProvider(server_url=url, storage=store, client_id=client_id,
                                          assertion_provider=assertion, scope=scope, issuer=issuer)
    return ClientCredentialsOAuthProvider(server_url=url, storage=store, client_id=client_id,
                                          client_secret=client_secret, scope=scope, issuer=issuer,
                                          token_endpoint_auth_method=method)  # type: ignore[arg-type]
