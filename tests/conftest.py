"""Suite-wide fixtures. Each test that starts a server stops it; everything listens on 127.0.0.1."""

pytest_plugins = ("pytest_jupyter.jupyter_server",)


import os

import pytest
from hypothesis import settings

# Hypothesis' default 200 ms deadline per example is a timed assertion: on a loaded 2-core machine an
# unchanged rule failed it (tests/core/test_lineage.py). The properties are what these tests prove, not speed.
settings.register_profile("relay", deadline=None)
settings.load_profile("relay")

# A missing peer (Chromium, node packages, GNU diff, an MCP server) skips a test on a developer's machine.
# In CI everything is installed by .ci/run, so such a skip would hide a broken install: fail instead.
_MISSING_PEER = ("not installed", "is needed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if any(marker in reason for marker in _MISSING_PEER):
            report.outcome = "failed"
            report.longrepr = f"CI has no skips for missing peers: {reason}"
