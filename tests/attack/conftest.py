"""The red team's attacks (tests/attack): real servers, real kernels, driven only through public surfaces.

They reuse the rigs of the other areas (``tests/daemon/daemon_harness.py``, ``tests/kernel/real_server.py``),
uniquely named modules put on the path here (tests/ has no packages)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for _rig in ("daemon", "kernel"):
    if str(_TESTS / _rig) not in sys.path:
        sys.path.append(str(_TESTS / _rig))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def plain_tcp_daemon(tmp_path_factory: pytest.TempPathFactory):
    """One ``jupyter relay serve --listen tcp://127.0.0.1:0`` without a model, shared by the attacks that only
    need the daemon's listener and its own clients (test_preauth_body, test_slowloris): a daemon's start is
    most of such a test's time. Each attack leaves it as it found it (its descriptor limit restored)."""
    from daemon_harness import start_daemon

    root = tmp_path_factory.mktemp("plain-daemon")
    (root / "cfg").mkdir()
    daemon = start_daemon(root, "--listen", "tcp://127.0.0.1:0")
    try:
        yield daemon
    finally:
        daemon.stop()
