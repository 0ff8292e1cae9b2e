"""Crash repair: a journal with an intent and no outcome -> interrupted + "outcome unknown", never re-run."""

from __future__ import annotations

import json

import pytest

from relay_jupyter.core.memory import MemoryRunJournal
from relay_jupyter.protocol.names import TERMINAL_EVENTS, EventType
from relay_jupyter.runtime.context import OUTCOME_UNKNOWN, prepare, user_message
from relay_jupyter.runtime.conversations import MemoryConversations
from relay_jupyter.runtime.manager import RunManager
from relay_jupyter.storage.sqlite import Store

from .rig import ORIGIN, Recorder, Tools, make_gate


def crashed(journal, conversations) -> None:
    """State as a broker SIGKILLed in the middle of call w1 leaves it (w2 never started)."""
    journal.run_started("run_1", ORIGIN, "conv-1", {"model": "m"})
    history = [user_message("write two files", turn=0),
               {"role": "assistant", "turn": 0, "content": [
                   {"type": "tool_use", "id": "w1", "name": "write_file", "input": {"path": "a", "content": "x"}},
                   {"type": "tool_use", "id": "w2", "name": "write_file", "input": {"path": "b", "content": "y"}}]}]
    conversations.save_conversation("conv-1", ORIGIN, "c", history, {})
    journal.call_intent("run_1", "w1", "write_file", {"path": "a"})


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_recover_marks_interrupted_and_answers_outcome_unknown(kind, tmp_path):
    if kind == "sqlite":
        store = Store.open(tmp_path / "relay.db")
        journal = conversations = store
    else:
        journal, conversations = MemoryRunJournal(), MemoryConversations()
    crashed(journal, conversations)
    events, tools = Recorder(), Tools()
    gate, _, _ = make_gate()
    manager = RunManager(gate, journal, conversations, events, [tools.provider()], {})
    assert manager.recover() == ["run_1"]
    assert journal.unfinished_runs() == []
    assert journal.list_runs()[0]["state"] == "interrupted"
    assert journal.calls_without_outcome("run_1") == []
    (event,) = events.of(EventType.INTERRUPTED)
    assert event["run_id"] == "run_1" and event["outcome_unknown"] == ["w1"]
    messages = conversations.load_conversation("conv-1")["messages"]
    answers = {b["tool_use_id"]: b for b in messages[-1]["content"]}
    assert OUTCOME_UNKNOWN in answers["w1"]["content"] and answers["w1"]["is_error"]
    assert "not run" in answers["w2"]["content"]
    assert tools.written == []  # never re-executed
    # the next request is well-formed: every call answered, in order
    out = prepare(messages)
    assert [b["tool_use_id"] for b in out[-1]["content"]] == ["w1", "w2"]
    assert manager.recover() == []  # idempotent
    if kind == "sqlite":
        store.close()


# -- a crash during crash recovery (issue 12): SIGKILL-equivalent at every write point of recovery ----

DEAD_RUNS = ("run_a", "run_b")


def _dead_broker_state(data_dir) -> None:
    """What a broker SIGKILLed with two runs in flight leaves: calls with and without outcomes, a
    pending permission request of a run and one of a client call (no run), its lease with a dead pid."""
    import subprocess
    import sys

    from relay_jupyter.storage.paths import ensure_private_dir

    store = Store.open(ensure_private_dir(data_dir) / "relay.db")
    try:
        owner = store.acquire_lease()
        for n, run_id in enumerate(DEAD_RUNS):
            conv = f"{ORIGIN}|conv-{n}"
            store.run_started(run_id, ORIGIN, conv, {"model": "m"})
            uses = [{"type": "tool_use", "id": f"{run_id}_w{i}", "name": "write_file", "input": {"path": str(i)}}
                    for i in range(3)]
            store.save_conversation(conv, ORIGIN, "c", [user_message("go", turn=0),
                                                        {"role": "assistant", "turn": 0, "content": uses}], {})
            store.call_intent(run_id, f"{run_id}_w0", "write_file", {"path": "0"})
            store.call_outcome(run_id, f"{run_id}_w0", {"status": "ok"})
            store.call_intent(run_id, f"{run_id}_w1", "write_file", {"path": "1"})  # in flight at the kill
            store.append_event(EventType.PERMISSION_REQUEST, {"request_id": f"pr_{run_id}"}, origin=ORIGIN,
                               run_id=run_id)
        store.append_event(EventType.PERMISSION_REQUEST, {"request_id": "pr_client"}, origin=ORIGIN)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        with store.transaction() as conn:
            conn.execute("UPDATE owners SET pid = ? WHERE owner_id = ?", (gone.pid, owner))
    finally:
        store.close()


def _check_consistent(data_dir, *, complete: bool) -> None:
    """Each run is either untouched (unfinished, no terminal event) or fully repaired (interrupted,
    exactly one terminal event, every call answered with its true outcome, its request resolved)."""
    store = Store.open(data_dir / "relay.db")
    try:
        events = store.events_since(0)
        resolved = {e.data["request_id"]: e for e in events if e.type == EventType.PERMISSION_RESOLVED}
        for n, run_id in enumerate(DEAD_RUNS):
            run = store.get_run(run_id)
            ends = [e for e in events if e.run_id == run_id and e.type in TERMINAL_EVENTS]
            if run["finished_at"] is None:
                assert not complete, f"{run_id} left unfinished"
                assert ends == [] and f"pr_{run_id}" not in resolved
                assert store.calls_without_outcome(run_id) != []
                continue
            assert run["state"] == "interrupted" and [e.type for e in ends] == [EventType.INTERRUPTED]
            assert ends[0].data["outcome_unknown"] == [f"{run_id}_w1"]
            outcomes = {c["call_id"]: c["outcome"] for c in run["calls"]}
            assert outcomes == {f"{run_id}_w0": {"status": "ok"},  # never loses a recorded outcome
                                f"{run_id}_w1": {"status": "unknown", "outcome_unknown": True}}
            answers = {b["tool_use_id"]: b["content"] for b in
                       store.load_conversation(f"{ORIGIN}|conv-{n}")["messages"][-1]["content"]}
            assert "completed before the broker stopped" in str(answers[f"{run_id}_w0"])
            assert OUTCOME_UNKNOWN in str(answers[f"{run_id}_w1"]) and "not run" in str(answers[f"{run_id}_w2"])
            assert resolved[f"pr_{run_id}"].data["decision"] == "withdrawn"
            assert resolved[f"pr_{run_id}"].id < ends[0].id
        assert sum(1 for e in events if e.type == EventType.PERMISSION_RESOLVED) == len(resolved)  # never twice
        if complete:
            assert set(resolved) == {f"pr_{r}" for r in DEAD_RUNS} | {"pr_client"}
            assert store.pending_permissions() == []
    finally:
        store.close()


class _Recoverer:
    """One ``sigkill_broker.py --recover-many`` process: each :meth:`start` is a broker start on a data dir
    (crash repair) in a child process of its own, forked after the imports (sigkill_broker.recover_many)."""

    def __init__(self, tmp_path) -> None:
        import subprocess
        import sys
        from pathlib import Path

        self.stderr = tmp_path / "recover.stderr"
        with open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("sigkill_broker.py")),
                                          "--recover-many"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    def start(self, data_dir, crash_at: str | None = None) -> tuple[int, list[str]]:
        """``(exit code, stdout lines)`` of one broker start on ``data_dir``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"data_dir": str(data_dir), "crash_at": crash_at}).encode() + b"\n")
        self.proc.stdin.flush()
        lines: list[str] = []
        while True:
            line = self.proc.stdout.readline().decode()
            if not line:
                raise AssertionError(self.stderr.read_text(errors="replace")[-2000:])
            if line.startswith('{"rc": '):
                return json.loads(line)["rc"], lines
            lines.append(line)

    def errors(self) -> str:
        return self.stderr.read_text(errors="replace")[-2000:]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


@pytest.mark.slow
def test_a_kill_at_any_write_of_recovery_is_repaired_by_the_next_start(tmp_path):
    """The broker process doing recovery dies (``os._exit``, no cleanup) at write point N, for every N
    recovery has; after each death the state is consistent, and the next start finishes the job.
    Each broker start is a process of its own, forked from one that did the imports once."""
    starts = _Recoverer(tmp_path)
    try:
        killed_at = 0
        for n in range(1, 200):
            data = tmp_path / f"kill-{n}"
            _dead_broker_state(data)
            rc, _ = starts.start(data, f"recovery:{n}")
            if rc == 0:  # recovery has fewer than n write points: every one was tried
                _check_consistent(data, complete=True)
                break
            assert rc == 137, starts.errors()
            killed_at = n
            _check_consistent(data, complete=False)
            # restart (no hook): everything is repaired, exactly once (the child's second recover() in
            # the same process finds nothing left)
            rc, out = starts.start(data)
            assert rc == 0, starts.errors()
            assert json.loads(out[-1]) == {"again": []}
            _check_consistent(data, complete=True)
        # 2 runs x (before, 2 inside, after) + the orphan request's before/after
        assert killed_at >= 2 * 4 + 2
        # and a later start on a repaired dir changes nothing
        rc, _ = starts.start(tmp_path / f"kill-{killed_at}")
        assert rc == 0
        _check_consistent(tmp_path / f"kill-{killed_at}", complete=True)
    finally:
        starts.close()
