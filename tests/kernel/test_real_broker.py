"""End to end with the real broker in a real Jupyter server: kernel credential, grants, relay.* helpers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .conftest import execute, text_of
from .real_server import RealServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    with RealServer(tmp_path_factory.mktemp("srv")) as srv:
        yield srv


def test_kernel_gets_address_and_credential_but_no_secret(server: RealServer) -> None:
    kc = server.kernel_for("env.ipynb")
    _, msgs = execute(kc, "import os\nprint(sorted(k for k in os.environ if k.startswith('RELAY_')))\n"
                              "print('JPY' in ''.join(os.environ))")
    assert "'RELAY_KERNEL_CREDENTIAL', 'RELAY_URL'" in text_of(msgs)


def test_relay_helpers_against_the_real_broker(server: RealServer) -> None:
    kc = server.kernel_for("helpers.ipynb")
    assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
    # no grant yet: grants.create as the connect card would, then the helpers show it
    code = ("import asyncio\n"
            "s = get_ipython().magics_manager.registry['AgentMagics'].session\n"
            "c = await s.get_client()\n"
            "g = await c.call('grants.get')\nprint('before', g)\n"
            "await c.call('grants.create', {'tools': ['list_variables'], 'models': ['*']})\n"
            "print('after', (await c.call('grants.get'))['grant']['origin'])")
    reply, msgs = execute(kc, code)
    assert reply["status"] == "ok", text_of(msgs)
    assert "before {'grant': None}" in text_of(msgs) and "after notebook:helpers.ipynb" in text_of(msgs)
    reply, msgs = execute(kc, "relay.grants()")
    assert reply["status"] == "ok", text_of(msgs)
    assert "notebook:helpers.ipynb" in text_of(msgs) and "list_variables" in text_of(msgs)
    # issue 13: the budget in words and numbers, not raw JSON
    assert "tokens/day" in text_of(msgs) and "requests/min" in text_of(msgs), text_of(msgs)
    assert '"tokens_per_day"' not in text_of(msgs) and "'tokens_per_day'" not in text_of(msgs)
    reply, msgs = execute(kc, "relay.budget()")
    assert reply["status"] == "ok", text_of(msgs)
    assert "tokens today" in text_of(msgs)
    reply, msgs = execute(kc, "a = relay.audit()\nr = relay.runs()\nprint(type(a).__name__, type(r).__name__)")
    assert reply["status"] == "ok", text_of(msgs)
    assert "DataFrame DataFrame" in text_of(msgs)
    # issue 13: times are local date-times (the grant's audit record), not epoch floats
    reply, msgs = execute(kc, "import time\nrow = a.iloc[-1]\nprint('ts', type(row.ts).__name__, row.ts.tzinfo is not None,"
                              " abs(row.ts.timestamp() - time.time()) < 3600, str(row.ts)[:4])")
    assert reply["status"] == "ok", text_of(msgs)
    assert "ts Timestamp True True 20" in text_of(msgs), text_of(msgs)
    reply, msgs = execute(kc, "relay.diff('a\\nb\\n', 'a\\nc\\n')")
    assert reply["status"] == "ok" and "+c" in text_of(msgs)


def test_unconfigured_backend_fails_with_one_line(server: RealServer) -> None:
    kc = server.kernel_for("nobackend.ipynb")
    execute(kc, "%load_ext relay_jupyter")
    execute(kc, "s = get_ipython().magics_manager.registry['AgentMagics'].session\n"
                "await (await s.get_client()).call('grants.create', {'tools': ['*'], 'models': ['*']})")
    reply, msgs = execute(kc, "%%agent --backend openai\nhello")
    assert reply["status"] == "error"
    (tb,) = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert len(tb) == 1 and tb[0].startswith("\x1b[0;31mrelay:"), tb
    assert "openai" in tb[0].lower() or "backend" in tb[0].lower(), tb


def test_revoke_button_revokes_the_grant(server: RealServer) -> None:
    kc = server.kernel_for("revoke.ipynb")
    execute(kc, "%load_ext relay_jupyter")
    execute(kc, "s = get_ipython().magics_manager.registry['AgentMagics'].session\n"
                "c = await s.get_client()\n"
                "await c.call('grants.create', {'tools': ['list_variables'], 'models': ['*']})")
    reply, msgs = execute(kc, "relay.grants()")
    assert reply["status"] == "ok", text_of(msgs)
    (button,) = [m["content"]["comm_id"] for m in msgs if m["msg_type"] == "comm_open"
                 and m["content"]["data"]["state"].get("description") == "Revoke"]
    kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": button, "data": {
        "method": "custom", "content": {"event": "click"}}}))
    # the click's task runs on the kernel's loop; the next cell waits for the broker to agree
    reply, msgs = execute(kc, "import asyncio\n"
                              "for _ in range(100):\n"
                              "    if (await c.call('grants.get'))['grant'] is None: break\n"
                              "    await asyncio.sleep(0.05)\n"
                              "print('grant', (await c.call('grants.get'))['grant'])")
    assert "grant None" in text_of(msgs)
