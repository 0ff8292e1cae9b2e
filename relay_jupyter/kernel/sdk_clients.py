"""``relay.anthropic()``, ``relay.async_anthropic()``, ``relay.claude_env()``: Claude from your own code through
relay's Anthropic-compatible endpoint (docs/proxy.md, issue 16 item 7); ``relay.openai()``, ``relay.async_openai()``:
the official ``openai`` SDK through relay's OpenAI-compatible endpoint (``relay/openai/v1``, issue 16 item 8).

The clients are the official ``anthropic`` SDK's, pointed at ``<relay>/anthropic`` with this kernel's own
credential as the API key — which is all the kernel holds: the broker checks the notebook's grant, reserves
its budget, forwards with the real key and audits. The SDK is imported only when one of these is called
(``%load_ext`` stays light); import-linter lets this one module import it (``pyproject.toml``), because a
client of relay's endpoint holds no key and no route around the gate.

Over a daemon's Unix socket the SDK gets an ``httpx2`` transport bound to the socket (its own HTTP client);
the ``claude`` CLI cannot use a socket, so :func:`claude_env` needs an HTTP endpoint.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from ..protocol.client_names import INSTANCE_HEADER, kernel_instance
from .errors import AgentError

__all__ = ["anthropic_client", "claude_env", "endpoint_target", "openai_client"]

_QUIET = {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def endpoint_target(endpoint: Any, wire: str = "anthropic") -> tuple[str, str, dict[str, str], str | None]:
    """(base_url, api_key, default_headers, unix socket path or None) for the SDKs, from a kernel
    :class:`~relay_jupyter.kernel.client.Endpoint`; ``wire``: ``anthropic`` or ``openai/v1`` (the path under
    ``relay/``)."""
    auth = endpoint.auth or ""
    scheme, _, value = auth.partition(" ")
    key = value.strip() if scheme in ("RelayKernel", "Bearer") and value.strip() else "unix-socket-peer"
    headers = {"X-Relay-Client": endpoint.client_name}
    credential = getattr(endpoint, "kernel_credential", None)
    if credential:  # a kernel registered with the daemon: its origin is bound to this credential
        headers["X-Relay-Kernel"] = credential
    instance = kernel_instance(os.environ)
    if instance:  # a JupyterHub thin server's id for this kernel: the service ends its requests with the kernel
        headers[INSTANCE_HEADER] = instance
    parts = urlsplit(endpoint.url)
    if parts.scheme == "unix":
        return f"http://localhost/relay/{wire}", key, headers, parts.path
    base = endpoint.url if endpoint.url.endswith("/") else endpoint.url + "/"
    return base + wire, key, headers, None


def _profile_header(profile: Any, call: str) -> str:
    if not isinstance(profile, str) or not profile.strip():
        raise AgentError(f"{call}(profile=...) takes a profile name (jupyter relay profiles list)")
    return profile.strip()


def anthropic_client(endpoint: Any, *, asynchronous: bool = False, profile: str | None = None, **kwargs: Any) -> Any:
    """An ``anthropic.Anthropic`` (or ``AsyncAnthropic``) client wired to relay; ``profile``: one of the
    broker's named upstreams (``c.RelayApp.profiles``) that the notebook's grant lists, sent as
    ``X-Relay-Profile`` on every request.

    Raises:
        AgentError: the ``anthropic`` package is not installed in this kernel's environment.
    """
    try:
        import anthropic
    except ImportError:
        raise AgentError("relay.anthropic() needs the anthropic package in this kernel: pip install anthropic") from None
    base_url, key, headers, socket_path = endpoint_target(endpoint)
    headers = {**headers, **kwargs.pop("default_headers", {})}
    if profile is not None:
        headers["X-Relay-Profile"] = _profile_header(profile, "relay.anthropic")
    if socket_path is not None and "http_client" not in kwargs:
        import httpx2  # the SDK's own transport library

        transport = (httpx2.AsyncHTTPTransport if asynchronous else httpx2.HTTPTransport)(uds=socket_path)
        kwargs["http_client"] = (httpx2.AsyncClient if asynchronous else httpx2.Client)(transport=transport)
    cls = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
    return cls(api_key=key, base_url=base_url, default_headers=headers, **kwargs)


def openai_client(endpoint: Any, *, asynchronous: bool = False, profile: str | None = None, **kwargs: Any) -> Any:
    """An ``openai.OpenAI`` (or ``AsyncOpenAI``) client wired to relay's OpenAI-compatible endpoint with this
    kernel's credential as its API key (sent as ``Authorization: Bearer``); ``profile``: a named upstream of the
    broker that the notebook's grant lists (``X-Relay-Profile``). The broker forwards to its configured
    ``openai_base_url`` (or the profile's) with its own key, after the gate.

    Raises:
        AgentError: the ``openai`` package is not installed in this kernel's environment.
    """
    try:
        import openai
    except ImportError:
        raise AgentError("relay.openai() needs the openai package in this kernel: pip install openai") from None
    base_url, key, headers, socket_path = endpoint_target(endpoint, "openai/v1")
    headers = {**headers, **kwargs.pop("default_headers", {})}
    if profile is not None:
        headers["X-Relay-Profile"] = _profile_header(profile, "relay.openai")
    if socket_path is not None and "http_client" not in kwargs:
        import httpx  # the openai SDK's own transport library

        transport = (httpx.AsyncHTTPTransport if asynchronous else httpx.HTTPTransport)(uds=socket_path)
        kwargs["http_client"] = (httpx.AsyncClient if asynchronous else httpx.Client)(transport=transport)
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return cls(api_key=key, base_url=base_url, default_headers=headers, **kwargs)


def claude_env(endpoint: Any, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a ``claude`` CLI subprocess that uses Claude through relay.

    Raises:
        AgentError: the broker is reached over a Unix socket (the CLI speaks only HTTP).
    """
    base_url, key, headers, socket_path = endpoint_target(endpoint)
    if socket_path is not None:
        raise AgentError("the claude CLI cannot reach a relay daemon on a Unix socket: run `jupyter relay serve "
                         "--listen tcp://127.0.0.1:PORT` and set RELAY_URL")
    env = dict(os.environ if base is None else base)
    for name in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        env.pop(name, None)
    env.update(ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY=key, **_QUIET)
    # the CLI's extra request headers (``ANTHROPIC_CUSTOM_HEADERS``: ``Name: Value`` lines, code.claude.com env-vars):
    # the same ones the SDK clients send, so the CLI's requests are this kernel's — its credential (the daemon's
    # origin), its client name (the hub service's origin) and its instance id (the hub service ends them with it)
    for name, value in headers.items():
        if not value.isprintable():  # a newline would add a header of its own to every request: refuse, one line
            raise AgentError(f"relay.claude_env(): the {name} header this kernel would send is not one printable line")
    ours = {name.lower() for name in headers}  # inherited lines (e.g. X-Relay-Profile) stay, unless they name ours
    kept = [line for line in env.get("ANTHROPIC_CUSTOM_HEADERS", "").splitlines()
            if line.strip() and line.partition(":")[0].strip().lower() not in ours]
    env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join([f"{name}: {value}" for name, value in headers.items()] + kept)
    return env
