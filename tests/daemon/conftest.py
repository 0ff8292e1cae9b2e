"""Fixtures: real ``jupyter-relay serve`` subprocesses in a temporary data/runtime dir, stopped afterwards."""

from __future__ import annotations

import pytest
from daemon_harness import start_daemon


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory):
    """One TCP daemon per module (tests that trip the cooldown use their own loopback source address)."""
    daemon = start_daemon(tmp_path_factory.mktemp("tcp"), "--listen", "tcp://127.0.0.1:0")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def unix_daemon(tmp_path_factory):
    root = tmp_path_factory.mktemp("unix")
    daemon = start_daemon(root, "--listen", f"unix://{root}/sock/relay.sock")
    yield daemon
    daemon.stop()
