"""The user's own Claude login for the claude-code engine (issue 17 item 1, ``login: own``): the CLI gets the
user's token (``claude setup-token``) from a 0600 file and talks to Anthropic itself — never relay's key,
never relay's endpoint — while every tool call still goes through the gate; the run is reserved in the
ledger before the CLI starts (a spent budget: nothing is sent) and settled with the usage the SDK reports.

"Anthropic" here is the shipped ``FakeAnthropic`` named by ``anthropic_base_url``; the REAL bundled CLI;
``peer``, only inside ``unshare -n``.
"""

from __future__ import annotations

import os

import pytest

from relay_jupyter.broker.assembly import install_components
from relay_jupyter.broker.broker import Broker
from relay_jupyter.broker.config import BrokerConfig
from relay_jupyter.broker.dispatch import call_method
from relay_jupyter.core.errors import Refusal
from relay_jupyter.core.types import Budget, Grant
from relay_jupyter.protocol.names import EventType
from relay_jupyter.testing import FakeAnthropic, Reply, Usage, tool_use

from .claude_code_rig import KEY, MODEL, NB, ONLY_ISOLATED, close, events, terminal, terminal_data, workspace

pytest.importorskip("claude_agent_sdk")

pytestmark = [pytest.mark.peer, pytest.mark.asyncio, ONLY_ISOLATED]

TOKEN = "sk-ant-oat01-test-user-own-login-0123456789"


@pytest.fixture
def fake():
    with FakeAnthropic(api_key=None, default=Reply("(fake) nothing scripted")) as server:
        yield server


def _broker(tmp_path, fake, token_file, budget: Budget | None = None) -> Broker:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    # a run's reservation (default: the grant's max_tokens_per_run, 100k) would pass the default $5 day budget
    # at an unknown model's highest rate: reserve 20k tokens per run here
    engine = {"login": "own", "oauth_token_file": str(token_file), "anthropic_base_url": fake.base_url,
              "run_reservation_tokens": 20_000}
    broker = Broker.open(BrokerConfig(data_dir=tmp_path / "relay", consent_timeout=30, anthropic_api_key=KEY,
                                      anthropic_base_url=fake.base_url, default_model=MODEL,
                                      default_engine="claude-code", extra={"engines": {"claude-code": engine}}))
    broker.grants.issue(Grant(origin=NB.origin, tools=frozenset({"*"}), models=frozenset({"*"}),
                              budget=budget or Budget(), consent_id="t"))
    install_components(broker, jupyter_root=root)
    return broker


def _token_file(tmp_path, mode: int = 0o600):
    path = tmp_path / "claude-token"
    path.write_text(TOKEN + "\n")
    os.chmod(path, mode)
    return path


async def test_own_login_talks_to_anthropic_itself_and_settles_the_ledger(tmp_path, fake):
    broker = _broker(tmp_path, fake, _token_file(tmp_path))
    try:
        ws = workspace(broker, "o1")
        (ws / "a.txt").write_text("own login\n")
        fake.enqueue(Reply(tool_use("Read", {"file_path": str(ws / "a.txt")}), usage=Usage(input_tokens=900,
                                                                                          output_tokens=40)),
                     Reply("It says own login.", usage=Usage(input_tokens=1000, output_tokens=60)))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "o1", "prompt": "read a.txt"}))[
            "run_id"]
        assert await terminal(broker, run_id) == EventType.DONE, terminal_data(broker, run_id)
        assert fake.saw_api_key(TOKEN) and not fake.saw_api_key(KEY)  # the user's login, never relay's key
        assert len(fake.requests) == 2
        # the tool call was still gated
        assert [e.data["decision"] for e in events(broker, run_id, EventType.TOOL_DECIDED)] == ["allow"]
        model = [r for r in broker.audit.tail(1000, origin=NB.origin) if r.tool == f"model:{MODEL}"]
        assert not any(r.arguments.get("purpose") == "proxy" for r in model)  # nothing went through relay's endpoint
        (reserved,) = [r for r in model if r.decision == "allow"]
        assert reserved.arguments["purpose"] == "claude-code-login"
        (settled,) = [r for r in model if r.decision == "settled"]
        assert settled.arguments["basis"] == "reported" and settled.arguments["tokens"] > 0
        assert broker.ledger.usage(NB.origin)["tokens"] == settled.arguments["tokens"]
    finally:
        await close(broker)


async def test_own_login_refusals_are_one_line_and_send_nothing(tmp_path, fake):
    broker = _broker(tmp_path, fake, _token_file(tmp_path, 0o644))
    try:
        with pytest.raises(Refusal) as info:
            await call_method(broker, NB, "run.start", {"conversation": "o2", "prompt": "p"})
        assert info.value.code.value == "NO_CREDENTIALS" and "chmod 600" in info.value.message
        assert "\n" not in info.value.message and TOKEN not in info.value.message
    finally:
        await close(broker)
        broker.close()
    # a day budget that cannot hold the run's reservation: the run ends before the CLI sends anything
    broker = _broker(tmp_path, fake, _token_file(tmp_path), budget=Budget(tokens_per_day=1000))
    try:
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "o3", "prompt": "p"}))["run_id"]
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED
        assert fake.requests == [] and not fake.saw_api_key(TOKEN)
    finally:
        await close(broker)


async def test_own_login_counts_each_requests_usage_and_stops_before_the_request_past_the_cap(tmp_path, fake):
    """relay sees no request of the user's own login, but the SDK's stream reports each one's usage: it is counted
    into the run, and once the next request (which resends the whole conversation) would pass the grant's
    ``max_tokens_per_run`` with room for a short answer (1,024 tokens) the run stops before the CLI sends it — not
    only once, at the start."""
    broker = _broker(tmp_path, fake, _token_file(tmp_path), budget=Budget(max_tokens_per_run=14_000))
    try:
        ws = workspace(broker, "o4")
        script = []
        for i in range(5):
            (ws / f"f{i}.txt").write_text(f"{i}\n")
            script.append(Reply(tool_use("Read", {"file_path": str(ws / f"f{i}.txt")}),
                                usage=Usage(input_tokens=6_000, output_tokens=40)))
        fake.enqueue(*script, Reply("never reached", usage=Usage(input_tokens=6_000, output_tokens=40)))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "o4", "prompt": "read them",
                                                              "mode": "full"}))["run_id"]
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED, terminal_data(broker, run_id)
        # 6,040 counted (the next, at least 6,040 + 1,024 more, fits 14,000), then 12,080: a third request would
        # resend at least 6,040 more and need room for 1,024 output tokens: past 14,000, never sent
        assert len(fake.requests) == 2
        message = terminal_data(broker, run_id)["message"]
        assert message == ("token limit of 14000 per run reached (12080 used, at least 7064 more for the next "
                           "request)")
        assert len(events(broker, run_id, EventType.BUDGET_EXHAUSTED)) == 1
        # the run's ledger charge never passes its reservation (20,000 here)
        assert broker.ledger.usage(NB.origin)["tokens"] <= 20_000
    finally:
        await close(broker)


async def test_own_login_stops_a_request_whose_input_leaves_no_room_at_its_message_start(tmp_path, fake):
    """The next request resends the conversation and adds the tool results, which relay cannot count before the
    CLI sends it: once its ``message_start`` reports an input that leaves no room for a short answer under the
    cap, the run stops there — the answer of that request is never waited for."""
    broker = _broker(tmp_path, fake, _token_file(tmp_path), budget=Budget(max_tokens_per_run=14_000))
    try:
        ws = workspace(broker, "o5")
        (ws / "big.txt").write_text("big\n")
        fake.enqueue(Reply(tool_use("Read", {"file_path": str(ws / "big.txt")}),
                           usage=Usage(input_tokens=6_000, output_tokens=40)),
                     Reply("x" * 4000, usage=Usage(input_tokens=9_000, output_tokens=2_000)),
                     Reply("never reached"))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "o5", "prompt": "read it",
                                                              "mode": "full"}))["run_id"]
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED, terminal_data(broker, run_id)
        assert len(fake.requests) == 2
        assert terminal_data(broker, run_id)["message"] == (
            "token limit of 14000 per run reached (6040 used, 9000 more asked by the next request)")
        assert broker.ledger.usage(NB.origin)["tokens"] <= 20_000
    finally:
        await close(broker)


async def test_own_login_stops_an_answer_mid_stream_once_its_bytes_pass_the_cap(tmp_path, fake):
    """An answer's output tokens are reported only at its end: while it streams, relay counts one token per UTF-8
    byte (never fewer than the truth) and stops the run once that passes what the cap leaves — the CLI is killed
    mid-answer rather than left to spend up to its own ``max_tokens``."""
    broker = _broker(tmp_path, fake, _token_file(tmp_path), budget=Budget(max_tokens_per_run=14_000))
    try:
        long_answer = " ".join(f"word{i}" for i in range(4000))  # about 27,000 bytes; 6,000 input + that > 14,000
        fake.enqueue(Reply(long_answer, usage=Usage(input_tokens=6_000, output_tokens=9_000)))
        run_id = (await call_method(broker, NB, "run.start", {"conversation": "o6", "prompt": "write a lot"}))[
            "run_id"]
        assert await terminal(broker, run_id) == EventType.BUDGET_EXHAUSTED, terminal_data(broker, run_id)
        message = terminal_data(broker, run_id)["message"]
        assert message.startswith("token limit of 14000 per run reached (0 used, 6000 more in this request's input, "
                                  "its answer stopped at about "), message
        stopped_at = int(message.rsplit("about ", 1)[1].split(" ")[0])
        assert 8_000 < stopped_at < len(long_answer)  # past what was left (8,000), before the answer's end
        assert len(fake.requests) == 1
    finally:
        await close(broker)
