"""Telemetry surfaces end to end (issue 16 item 5): a real Jupyter server with the relay extension and the
shipped fake Anthropic upstream; in a real kernel, the official ``anthropic`` SDK (``relay.anthropic()``)
and a ``%%agent`` cell make model requests; ``relay.telemetry()`` returns them as a DataFrame, and
``relay.spend()`` shows a real PNG figure in the cell. From outside, ``telemetry.query`` with another
notebook's credential sees none of them, and ``/metrics`` has the latency and TTFT histograms.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

import pytest

from relay_jupyter.testing import FakeAnthropic
from relay_jupyter.testing.script import Reply, Usage, text

from .conftest import execute, text_of
from .real_server import TOKEN, RealServer

pytestmark = pytest.mark.slow

KEY = "sk-ant-broker-key-telemetry-0123456789"
MODEL = "claude-test-1"
SECRET = "PROMPT-TEXT-only-for-the-model-91ac"



@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("telemetry")
    with FakeAnthropic(api_key=KEY, models=(MODEL,)) as fake, \
            RealServer(tmp, relay_config={"anthropic_api_key": KEY, "anthropic_base_url": fake.base_url,
                                          "default_model": MODEL}) as srv:
        kc = srv.kernel_for("spend.ipynb")
        reply, msgs = execute(kc, "%load_ext relay_jupyter\n"
                                  f"relay.connect([], models=[{MODEL!r}])\nimport os\n"
                                  "print(os.environ['RELAY_KERNEL_CREDENTIAL'])", timeout=60)
        assert reply["status"] == "ok", text_of(msgs)
        yield srv, fake, kc, text_of(msgs).split()[-1]


def test_sdk_and_agent_requests_reach_relay_telemetry_and_spend(served) -> None:
    srv, fake, kc, credential = served
    fake.enqueue(Reply(text("one"), usage=Usage(input_tokens=6, output_tokens=2)),
                 Reply(text("two"), usage=Usage(input_tokens=9, output_tokens=3)),
                 Reply(text("agent answer"), usage=Usage(input_tokens=12, output_tokens=4)))
    reply, msgs = execute(kc, "c = relay.anthropic(max_retries=0)\n"
                              f"h = [{{'role': 'user', 'content': {SECRET!r}}}]\n"
                              f"m = c.messages.create(model={MODEL!r}, max_tokens=32, messages=h)\n"
                              "h += [{'role': 'assistant', 'content': m.content[0].text},"
                              " {'role': 'user', 'content': 'and then?'}]\n"
                              f"with c.messages.stream(model={MODEL!r}, max_tokens=32, messages=h) as s:\n"
                              "    print(''.join(s.text_stream))", timeout=90)
    assert reply["status"] == "ok" and "two" in text_of(msgs), text_of(msgs)
    reply, msgs = execute(kc, f"%%agent --model {MODEL}\nsay something", timeout=90)
    assert reply["status"] == "ok" and "agent answer" in text_of(msgs), text_of(msgs)

    reply, msgs = execute(kc, "df = relay.telemetry()\n"
                              "print(df[['source', 'lineage', 'status', 'input_tokens', 'output_tokens', 'tokens']]"
                              ".to_json(orient='records'))\n"
                              "print(str(df['ts'].dtype), bool((df['cost_usd'] > 0).all()),"
                              " bool((df['ttft_ms'] <= df['latency_ms']).all()), df['origin'].unique().tolist())",
                          timeout=60)
    out = text_of(msgs)
    assert reply["status"] == "ok", out
    table, checks = out.strip().splitlines()[-2:]
    assert json.loads(table) == [
        {"source": "proxy", "lineage": "new", "status": "ok", "input_tokens": 6, "output_tokens": 2, "tokens": 8},
        {"source": "proxy", "lineage": "continuation", "status": "ok", "input_tokens": 9, "output_tokens": 3,
         "tokens": 12},
        {"source": "agent", "lineage": None, "status": "ok", "input_tokens": 12, "output_tokens": 4, "tokens": 16}]
    assert checks.startswith("datetime64") and "True True ['notebook:spend.ipynb']" in checks, checks
    assert SECRET not in out

    # the spend figure: a real PNG in the cell's result (shown once), and a Figure the user can save
    reply, msgs = execute(kc, "fig = relay.spend()\nfig", timeout=60)
    results = [m["content"]["data"] for m in msgs if m["msg_type"] in ("execute_result", "display_data")]
    assert reply["status"] == "ok" and len(results) == 1, text_of(msgs)
    png = base64.b64decode(results[0]["image/png"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    assert "Figure" in results[0]["text/plain"]
    reply, msgs = execute(kc, "print([ax.get_ylabel() for ax in fig.axes],"
                              " sorted(t.get_text() for t in fig.axes[0].get_legend().get_texts()))\n"
                              "fig2 = relay.spend(by='source')\n"
                              "print(sorted(t.get_text() for t in fig2.axes[0].get_legend().get_texts()))")
    lines = [line for line in text_of(msgs).splitlines() if line.strip()]
    assert lines[-2] == f"['spend (USD, cumulative)', 'tokens per request'] ['{MODEL}']", lines
    assert lines[-1] == "['agent', 'proxy']", lines

    # the same rows over the RPC, with this kernel's credential only
    rows = srv.kernel_rpc(credential, "telemetry.query", {"limit": 2})["result"]["rows"]
    assert [r["source"] for r in rows] == ["proxy", "agent"] and SECRET not in json.dumps(rows)
    refused = srv.kernel_rpc(credential, "telemetry.query", {"origin": "notebook:other.ipynb"})
    assert refused["error"]["data"]["code"] == "UNAUTHORIZED"
    other = srv.kernel_for("other.ipynb")
    _, msgs = execute(other, "import os; print(os.environ['RELAY_KERNEL_CREDENTIAL'])")
    assert srv.kernel_rpc(text_of(msgs).split()[-1], "telemetry.query")["result"]["rows"] == []

    # /metrics: the histograms
    req = urllib.request.Request(srv.url + "relay/metrics", headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        metrics = resp.read().decode()
    assert 'relay_model_request_seconds_count{source="proxy"} 2.0' in metrics
    assert 'relay_model_ttft_seconds_count{source="agent"} 1.0' in metrics
    assert 'relay_model_request_seconds_bucket{le="0.05",source="proxy"}' in metrics


def test_bad_arguments_are_one_line_errors(served) -> None:
    _, _, kc, _ = served
    for code, expected in (("relay.telemetry(since='yesterday')", "relay.telemetry: since"),
                           ("relay.spend(by='colour')", "relay.spend: by must be one of")):
        reply, msgs = execute(kc, code)
        out = text_of(msgs)
        assert reply["status"] == "error" and expected in out, out
        assert "Traceback" not in out and len(out.strip().splitlines()) <= 2, out
