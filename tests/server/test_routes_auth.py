"""Every route of the extension, every verb: refuses unauthenticated and cross-origin requests;
a kernel credential that is wrong, stale or only differs in case is refused too."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from relay_jupyter.server.handlers import AUTH_RESOURCE, relay_handlers

VERBS = ("get", "post", "put", "delete", "patch")


def route_verbs():
    out = []
    for pattern, handler in relay_handlers():
        for verb in VERBS:
            impl = handler.__dict__.get(verb)
            if impl is not None:
                out.append((pattern.lstrip("/"), verb.upper()))
    return out


def test_every_verb_is_decorated():
    from relay_jupyter.server.anthropic_handlers import anthropic_handlers

    for pattern, handler in relay_handlers() + anthropic_handlers():
        assert handler.auth_resource == AUTH_RESOURCE
        verbs = [v for v in VERBS if v in handler.__dict__]
        assert verbs, pattern
        for verb in verbs:
            impl = handler.__dict__[verb]
            # @authorized wraps with functools.wraps, @web.authenticated too: two layers above the body
            assert hasattr(impl, "__wrapped__") and hasattr(impl.__wrapped__, "__wrapped__"), (pattern, verb)


async def fetch_status(url, method, headers, body=None):
    client = AsyncHTTPClient()
    try:
        resp = await client.fetch(url, method=method, headers=headers, body=body, raise_error=True,
                                  request_timeout=10, follow_redirects=False)
        return resp.code, resp.body
    except HTTPClientError as exc:
        return exc.code, exc.response.body if exc.response is not None else b""


@pytest.fixture
def base(jp_http_port, jp_base_url):
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}"


async def test_unauthenticated_and_cross_origin_are_refused(jp_fetch, base, jp_serverapp):
    # a browser-style login: the token in the URL sets the login cookie
    client = AsyncHTTPClient()
    resp = await client.fetch(f"{base}api/status?token={jp_serverapp.identity_provider.token}", request_timeout=10)
    cookies = [v.split(";", 1)[0] for k, v in resp.headers.get_all() if k.lower() == "set-cookie"]
    assert any("username-" in c for c in cookies), cookies
    cookie = "; ".join(cookies)
    routes = route_verbs()
    assert {r for r, _ in routes} == {"relay/rpc", "relay/events", "relay/healthz", "relay/readyz", "relay/metrics"}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.list"}).encode()
    for path, verb in routes:
        data = body if verb == "POST" else None
        url = f"{base}{path}"
        status, _ = await fetch_status(url, verb, {}, data)
        assert status == 403, (path, verb, "unauthenticated", status)
        # same-origin cookie session works for GET (POST additionally needs the XSRF token)
        evil = {"Cookie": cookie, "Origin": "http://evil.example"}
        status, text = await fetch_status(url, verb, evil, data)
        assert status in (403, 404), (path, verb, "cross-origin", status)
        assert b"grants" not in text
        for bad in ("RelayKernel nope", "RelayKernel ", "relaykernel " + "A" * 43, "Bearer x"):
            status, _ = await fetch_status(url, verb, {"Authorization": bad}, data)
            assert status == 403, (path, verb, bad, status)


async def test_cookie_post_without_xsrf_is_refused(jp_fetch, base, jp_serverapp):
    client = AsyncHTTPClient()
    resp = await client.fetch(f"{base}api/status?token={jp_serverapp.identity_provider.token}", request_timeout=10)
    cookie = "; ".join(v.split(";", 1)[0] for k, v in resp.headers.get_all() if k.lower() == "set-cookie")
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.list"}).encode()
    status, _ = await fetch_status(f"{base}relay/rpc", "POST", {"Cookie": cookie}, body)
    assert status in (403, 404)
    status, text = await fetch_status(f"{base}relay/healthz", "GET", {"Cookie": cookie})
    assert status == 200 and json.loads(text) == {"status": "ok"}
