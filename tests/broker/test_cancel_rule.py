"""One cancel rule for ``run.cancel`` and ``runs.cancel`` (docs/runtime.md, ``broker/methods/_access.RUNS``):
a run is cancelled only by the client that started it or by a browser session of the server's user;
another kernel of the same notebook gets ``NOT_ORIGINATOR``; a client of another notebook gets
``NOT_FOUND`` (the same answer as for a run id that does not exist). Real broker, real runtime, real
Anthropic backend against the shipped fake server."""

from __future__ import annotations

import pytest

from relay_jupyter.backends.anthropic import AnthropicBackend
from relay_jupyter.backends.base import RetryPolicy
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.broker.runs import install_runtime
from relay_jupyter.core.caller import Caller, CallerKind
from relay_jupyter.core.errors import Refusal
from relay_jupyter.core.types import Grant
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.testing import FakeAnthropic, Reply

KEY = "sk-test-cancel-rule-0123456789"
NB = "notebook:a.ipynb"
KERNEL = Caller(kind=CallerKind.KERNEL, origin=NB, client_id="kernel:k1")            # starts the runs
SECOND_KERNEL = Caller(kind=CallerKind.KERNEL, origin=NB, client_id="kernel:k2")     # same notebook
DAEMON_CLIENT = Caller(kind=CallerKind.DAEMON, origin=NB, client_id="daemon:vscode")  # same notebook
OTHER_NOTEBOOK = Caller(kind=CallerKind.KERNEL, origin="notebook:b.ipynb", client_id="kernel:k3")
BROWSER = Caller(kind=CallerKind.BROWSER, origin=None, client_id="browser:me:panel", user="me")

pytestmark = pytest.mark.asyncio
CANCEL_METHODS = ["run.cancel", "runs.cancel"]


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=KEY) as server:
        yield server


@pytest.fixture
def broker(fake):
    b = Broker.open(BrokerConfig(in_memory=True, default_model="claude-test-1"))
    b.grants.issue(Grant(origin=NB, tools=frozenset({"*"}), models=frozenset({"*"}), consent_id="c"))
    retry = RetryPolicy(max_attempts=1, base_delay=0.01, max_delay=0.1, max_total_wait=0.1)
    install_runtime(b, {"anthropic": AnthropicBackend(KEY, base_url=fake.base_url, models=("claude-*",),
                                                      retry=retry, timeout=30)})
    yield b
    b.close()


async def _start(broker: Broker, fake, conversation: str) -> str:
    # a long answer, streamed slowly: the run is still live for every check below (it is cancelled)
    fake.enqueue(Reply("word " * 50_000, tokens_per_second=50, chunk_tokens=1))
    run_id = (await call_method(broker, KERNEL, "run.start", {"conversation": conversation, "prompt": "go"}))["run_id"]
    assert broker.runs.get(run_id) is not None
    return run_id


async def _refused(broker: Broker, caller: Caller, method: str, run_id: str) -> str:
    with pytest.raises(Refusal) as info:
        await call_method(broker, caller, method, {"run_id": run_id})
    return info.value.code.value


async def _terminal(broker: Broker, run_id: str) -> list[str]:
    await broker.runs.wait(run_id)
    return [e.type for e in broker.store.events_since(0) if e.run_id == run_id and e.type in TERMINAL_EVENTS]


@pytest.mark.parametrize("method", CANCEL_METHODS)
async def test_only_the_originator_or_the_browser_cancels_a_live_run(broker, fake, method):
    run_id = await _start(broker, fake, "c1")
    assert await _refused(broker, SECOND_KERNEL, method, run_id) == "NOT_ORIGINATOR"
    assert await _refused(broker, DAEMON_CLIENT, method, run_id) == "NOT_ORIGINATOR"
    assert await _refused(broker, OTHER_NOTEBOOK, method, run_id) == "NOT_FOUND"
    assert broker.runs.get(run_id) is not None, "a refused cancel stopped the run"
    assert await call_method(broker, KERNEL, method, {"run_id": run_id}) == {"cancelled": True}
    assert await _terminal(broker, run_id) == [EventType.CANCELLED]

    panel_run = await _start(broker, fake, "c2")
    assert await call_method(broker, BROWSER, method, {"run_id": panel_run}) == {"cancelled": True}
    assert await _terminal(broker, panel_run) == [EventType.CANCELLED]


@pytest.mark.parametrize("method", CANCEL_METHODS)
async def test_the_rule_is_the_same_once_the_run_has_ended(broker, fake, method):
    run_id = await _start(broker, fake, "c1")
    await call_method(broker, KERNEL, method, {"run_id": run_id})
    await _terminal(broker, run_id)
    assert broker.runs.get(run_id) is None
    assert await call_method(broker, KERNEL, method, {"run_id": run_id}) == {"cancelled": False}
    assert await call_method(broker, BROWSER, method, {"run_id": run_id}) == {"cancelled": False}
    assert await _refused(broker, SECOND_KERNEL, method, run_id) == "NOT_ORIGINATOR"
    assert await _refused(broker, OTHER_NOTEBOOK, method, run_id) == "NOT_FOUND"


@pytest.mark.parametrize("method", CANCEL_METHODS)
async def test_another_notebooks_run_looks_like_a_missing_one(broker, fake, method):
    run_id = await _start(broker, fake, "c1")
    for caller in (KERNEL, OTHER_NOTEBOOK, BROWSER):
        assert await _refused(broker, caller, method, "run_does_not_exist") == "NOT_FOUND"
    missing = await _refused(broker, OTHER_NOTEBOOK, method, "run_does_not_exist")
    assert await _refused(broker, OTHER_NOTEBOOK, method, run_id) == missing
    await call_method(broker, KERNEL, method, {"run_id": run_id})
    await _terminal(broker, run_id)


@pytest.mark.parametrize("method", CANCEL_METHODS)
async def test_a_kernel_cannot_name_another_notebook_to_cancel_in(broker, fake, method):
    # run.cancel / runs.cancel take no origin: an extra field is invalid params, not a way around the rule
    run_id = await _start(broker, fake, "c1")
    with pytest.raises(Exception) as info:
        await call_method(broker, OTHER_NOTEBOOK, method, {"run_id": run_id, "origin": NB})
    assert getattr(info.value, "rpc_code", None) == -32602
    assert broker.runs.get(run_id) is not None
    await call_method(broker, KERNEL, method, {"run_id": run_id})
    await _terminal(broker, run_id)
