"""The model endpoints' tests (issue 16): they reuse the daemon rig (``tests/daemon/daemon_harness.py``), a
uniquely named module put on the path here (tests/ has no packages)."""

from __future__ import annotations

import sys
from pathlib import Path

_DAEMON = Path(__file__).resolve().parents[1] / "daemon"
if str(_DAEMON) not in sys.path:
    sys.path.append(str(_DAEMON))
