"""Issue 13: a renamed notebook and a revoked grant never leave a cell waiting. A real Jupyter server (demo
backend) and a real kernel: after the notebook is renamed (JupyterLab PATCHes the session's path) its
``%%agent`` ends at once with one UNAUTHORIZED line — its event stream follows the kernel's new origin —
and once connected under the new name it streams its answer; after a revoke (as the side panel does, from
the browser identity) the next cell asks again instead of failing forever."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .conftest import execute, text_of
from .real_server import RealServer

pytestmark = pytest.mark.slow

CONNECT = "g = relay.connect([], models=['*'])\nprint('origin', g['origin'])"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    with RealServer(tmp_path_factory.mktemp("srv")) as srv:
        yield srv


def _session_id(srv: RealServer, path: str) -> str:
    return next(s["id"] for s in srv.api("GET", "api/sessions") if s["path"] == path)


def test_a_renamed_notebook_fails_fast_then_runs_under_its_new_name(server: RealServer) -> None:
    kc = server.kernel_for("before.ipynb")
    execute(kc, "%load_ext relay_jupyter")
    reply, msgs = execute(kc, CONNECT)
    assert "origin notebook:before.ipynb" in text_of(msgs), text_of(msgs)
    reply, msgs = execute(kc, "%%agent\nhello", timeout=60)
    assert reply["status"] == "ok" and "[demo]" in text_of(msgs), text_of(msgs)

    # what JupyterLab does on a rename: the session's path changes (the kernel stays)
    server.api("PATCH", f"api/sessions/{_session_id(server, 'before.ipynb')}", {"path": "mywork.ipynb"})
    reply, msgs = execute(kc, "%%agent\nWhich variables do I have?", timeout=60)  # hung forever before
    assert reply["status"] == "error", text_of(msgs)
    assert len([m for m in msgs if m["msg_type"] == "error"]) == 1, text_of(msgs)
    assert "renamed" in text_of(msgs) and "Traceback" not in text_of(msgs), text_of(msgs)

    reply, msgs = execute(kc, CONNECT)
    assert "origin notebook:mywork.ipynb" in text_of(msgs), text_of(msgs)
    reply, msgs = execute(kc, "%%agent\nhello again", timeout=60)
    assert reply["status"] == "ok" and "[demo]" in text_of(msgs), text_of(msgs)


def test_after_a_revoke_the_next_cell_asks_again(server: RealServer) -> None:
    kc = server.kernel_for("revoked.ipynb")
    execute(kc, "%load_ext relay_jupyter")
    execute(kc, CONNECT)
    reply, msgs = execute(kc, "%%agent\nhello", timeout=60)
    assert reply["status"] == "ok", text_of(msgs)
    # the side panel's Revoke: grants.revoke from the browser identity (the Jupyter token), not the kernel
    import json
    import urllib.request

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "grants.revoke",
                       "params": {"origin": "notebook:revoked.ipynb"}}).encode()
    req = urllib.request.Request(server.url + "relay/rpc", data=body, method="POST",
                                 headers={"Authorization": "token relay-test-token", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert "error" not in json.loads(resp.read())
    reply, msgs = execute(kc, "%%agent\nhello", timeout=60)
    assert reply["status"] == "error" and "run the cell again to see the connect card" in text_of(msgs), text_of(msgs)
    # the kernel forgot the grant: the next cell goes through the connect step again (here: asks for input,
    # the surface of a kernel with no widget frontend), instead of the same UNAUTHORIZED forever
    session = ("s = get_ipython().magics_manager.registry['AgentMagics'].session\n"
               "print('remembered', s.connected_origin)")
    reply, msgs = execute(kc, session)
    assert "remembered False" in text_of(msgs), text_of(msgs)


def test_relay_kill_in_a_cell_answers_with_counts(server: RealServer) -> None:
    kc = server.kernel_for("kill.ipynb")
    execute(kc, "%load_ext relay_jupyter")
    execute(kc, CONNECT)
    reply, msgs = execute(kc, "print(relay.kill())")
    assert reply["status"] == "ok" and "{'cancelled_runs': 0, 'denied_requests': 0}" in text_of(msgs), text_of(msgs)
