"""Fixtures of the runtime tests: both fake model servers, each behind its real backend."""

from __future__ import annotations

import pytest

from .rig import fake_server


@pytest.fixture(params=["anthropic", "openai"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def fake(backend_name: str):
    with fake_server(backend_name) as server:
        yield server
