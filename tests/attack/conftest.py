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
