"""Fixtures: a real Jupyter server on 127.0.0.1 with the relay extension (pytest-jupyter), stopped after each test."""

from __future__ import annotations

import json
from typing import Any

import pytest


@pytest.fixture
def jp_server_config(tmp_path):
    return {
        "ServerApp": {"jpserver_extensions": {"relay_jupyter": True}},
        "RelayApp": {"data_dir": str(tmp_path / "relaydata"), "heartbeat_interval": 0.2,
                     "consent_timeout": 5.0},
    }


@pytest.fixture
def relay_app(jp_serverapp):
    """The RelayApp extension instance of the running server."""
    ext = jp_serverapp.extension_manager.extension_points["relay_jupyter"].app
    return ext


@pytest.fixture
def broker(relay_app):
    return relay_app.broker


@pytest.fixture
def rpc(jp_fetch):
    """``await rpc(method, params, headers=...)`` -> the decoded JSON-RPC response object."""

    async def call(method: str, params: dict[str, Any] | None = None, *, headers: dict[str, str] | None = None,
                   id: Any = 1) -> dict[str, Any]:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": id}
        if params is not None:
            body["params"] = params
        resp = await jp_fetch("relay", "rpc", method="POST", body=json.dumps(body), headers=headers or {})
        return json.loads(resp.body)

    return call
