"""Issue 13 item 3: each %%agent answer's provenance is saved in the notebook (output metadata), shown as a
short footer, and read back by relay.provenance() -- also from a saved notebook in a fresh kernel. A real
Jupyter server (demo backend) and real kernels; a push approved by the headless allowlist records its
checkpoint id. Nothing secret and no tool arguments in the record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import execute, text_of
from .real_server import RealServer

pytestmark = pytest.mark.slow

SETUP = ("%load_ext relay_jupyter\n"
         "%config AgentMagics.consent_ui = 'headless'\n"
         "%config AgentMagics.headless_policy = 'allowlist'\n"
         "%config AgentMagics.headless_allowlist = ['scratch_push']\n"
         "import pandas as pd\n"
         "sales = pd.DataFrame({'month': [1, 2], 'revenue': [10.0, 12.5]})\n"
         "g = relay.connect(['list_variables', 'describe_dataframe', 'scratch_write', 'scratch_edit', "
         "'scratch_push'], models=['*'])")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    # a store on disk: the scratch workspace (and so push and checkpoints) needs a data directory
    with RealServer(tmp_path_factory.mktemp("srv"), {"in_memory": False}) as srv:
        yield srv


def _outputs(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cell's outputs as a frontend keeps them: an update_display_data replaces its display's data and
    metadata (what JupyterLab saves)."""
    outputs: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    for m in msgs:
        content = m["content"]
        display_id = (content.get("transient") or {}).get("display_id")
        if m["msg_type"] == "display_data":
            output = {"output_type": "display_data", "data": content["data"], "metadata": content.get("metadata") or {}}
            outputs.append(output)
            if display_id:
                by_id[display_id] = output
        elif m["msg_type"] == "update_display_data" and display_id in by_id:
            by_id[display_id].update(data=content["data"], metadata=content.get("metadata") or {})
    return outputs


def _provenance_outputs(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in _outputs(msgs) if "relay" in o["metadata"]]


def _as_notebook(cells: list[tuple[str, str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """What JupyterLab saves: each cell's outputs with their metadata (nbformat 4.5, cell ids)."""
    out = []
    for cell_id, source, msgs in cells:
        outputs = _outputs(msgs)
        out.append({"id": cell_id, "cell_type": "code", "source": source, "metadata": {}, "execution_count": 1,
                    "outputs": outputs})
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": out}


def test_each_answer_carries_its_provenance_and_relay_provenance_reads_it(server: RealServer) -> None:
    kc = server.kernel_for("prov.ipynb")
    reply, msgs = execute(kc, SETUP)
    assert reply["status"] == "ok", text_of(msgs)
    _, msgs = execute(kc, "import os\nprint('CRED', os.environ.get('RELAY_KERNEL_CREDENTIAL', ''))")
    credential = text_of(msgs).split("CRED", 1)[1].strip()
    assert len(credential) > 10

    reply, first = execute(kc, "%%agent\nDescribe the DataFrames", timeout=90, cell_id="cell-describe")
    assert reply["status"] == "ok", text_of(first)
    (shown,) = _provenance_outputs(first)
    record = shown["metadata"]["relay"]["provenance"]
    assert record["version"] == 1 and record["cell_id"] == "cell-describe" and record["outcome"] == "done"
    assert record["backend"] == "demo" and record["model"] and record["run_id"] in text_of(first)
    assert record["tokens"]["total"] > 0 and record["tokens"]["total"] == sum(
        record["tokens"][k] for k in ("input", "output", "cache_creation", "cache_read"))
    tools = [(c["tool"], c["class"], c["decision"], c["decided_by"]) for c in record["tool_calls"]]
    assert ("list_variables", "read", "allow", "grant") in tools, tools
    assert any(t[0] == "describe_dataframe" for t in tools), tools
    assert all(c["duration_ms"] is not None and c["is_error"] is False for c in record["tool_calls"])
    # the footer the record rides on reads in a saved notebook: model, backend, tool calls, run; nothing secret
    footer = shown["data"]["text/plain"]
    assert "✓ *done*" in footer and "· `demo` ·" in footer and f"{len(tools)} tool calls" in footer, footer
    assert "via demo" not in footer, footer  # the demo backend's model is "demo": named once
    assert record["run_id"] in shown["data"]["text/html"]
    blob = json.dumps(record)
    assert credential not in blob and "arguments" not in blob and "sales" not in blob

    reply, second = execute(kc, "%%agent\nWrite a cleaning script to a file and push it", timeout=90,
                            cell_id="cell-push")
    assert reply["status"] == "ok", text_of(second)
    push = _provenance_outputs(second)[0]["metadata"]["relay"]["provenance"]
    (pushed,) = [c for c in push["tool_calls"] if c["tool"] == "scratch_push"]
    assert pushed["decision"] == "allow" and pushed["decided_by"].startswith("kernel:"), pushed
    assert pushed["class"] == "write" and len(pushed["digests"].get("sha256", "")) == 64, pushed
    assert len(push["checkpoints"]) == 1, push
    assert push["checkpoints"][0] in _provenance_outputs(second)[0]["data"]["text/plain"]
    _, msgs = execute(kc, "print(relay.checkpoints()['id'].tolist())")
    assert push["checkpoints"][0] in text_of(msgs)
    assert credential not in json.dumps(push) and "arguments" not in json.dumps(push)

    # relay.provenance(): this kernel's answers (the notebook is not saved yet)
    _, msgs = execute(kc, "df = relay.provenance()\nprint(df[['run_id', 'cell_id', 'tool_calls']].to_dict('records'))"
                          "\nprint('CALLS', len(relay.provenance(calls=True)))")
    assert reply["status"] == "ok"
    assert record["run_id"] in text_of(msgs) and push["run_id"] in text_of(msgs), text_of(msgs)
    assert f"CALLS {len(record['tool_calls']) + len(push['tool_calls'])}" in text_of(msgs), text_of(msgs)

    # saved and reopened in a fresh kernel: read back from the notebook file
    saved = _as_notebook([("cell-describe", "%%agent\nDescribe the DataFrames", first),
                          ("cell-push", "%%agent\nWrite ...", second)])
    (server.root / "prov.ipynb").write_text(json.dumps(saved))
    fresh = server.kernel_for("prov.ipynb")
    _, msgs = execute(fresh, "%load_ext relay_jupyter\ndf = relay.provenance()\n"
                             "print(df[['run_id', 'cell_id', 'cell_index', 'backend']].to_dict('records'))")
    out = text_of(msgs)
    assert f"'run_id': '{record['run_id']}', 'cell_id': 'cell-describe', 'cell_index': 0" in out, out
    assert f"'run_id': '{push['run_id']}', 'cell_id': 'cell-push', 'cell_index': 1" in out, out

    # jupyter nbconvert --to html of the saved notebook shows each answer's footer (model, backend, tool calls)
    import subprocess
    import sys

    html = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--stdout",
                           str(server.root / "prov.ipynb")], capture_output=True, text=True, timeout=120,
                          env=server.env())
    assert html.returncode == 0, html.stderr[-2000:]
    assert "<code>demo</code>" in html.stdout and "via demo" not in html.stdout
    assert record["run_id"] in html.stdout and push["checkpoints"][0] in html.stdout


def test_a_failed_answer_records_its_outcome(server: RealServer) -> None:
    kc = server.kernel_for("prov-fail.ipynb")
    execute(kc, "%load_ext relay_jupyter\nrelay.connect(['*'], models=['*'], budget={'max_steps_per_run': 1})")
    reply, msgs = execute(kc, "%%agent\nDescribe the DataFrames", timeout=90)
    assert reply["status"] == "error", text_of(msgs)
    record = _provenance_outputs(msgs)[0]["metadata"]["relay"]["provenance"]
    assert record["outcome"] in ("budget_exhausted", "error"), record
    _, msgs = execute(kc, "print(relay.provenance()[['outcome']].to_dict('records'))\n"
                          "relay.provenance(path='no-such.ipynb')")
    assert record["outcome"] in text_of(msgs)
    errors = [m for m in msgs if m["msg_type"] == "error"]
    assert len(errors) == 1 and "cannot read the notebook" in text_of(msgs) and "Traceback" not in text_of(msgs)


def test_the_footer_names_the_backend_once_when_it_is_the_models_name() -> None:
    """ "`demo` via demo" read as a stutter (a fresh-clone check): the demo backend's model is ``demo``."""
    from relay_jupyter.kernel.provenance import footer_suffix

    assert footer_suffix({"model": "demo", "backend": "demo"}) == " · `demo`"
    assert footer_suffix({"model": "claude-x", "backend": "anthropic", "tool_calls": [{}]}) == \
        " · `claude-x` via anthropic · 1 tool call"
    assert footer_suffix({}) == " · `?`"
    assert footer_suffix({"model": "m"}) == " · `m` via ?"
    # neither name can close the code span or break the footer line
    assert footer_suffix({"model": "a`b\nc", "backend": "x`\ny"}) == " · `a'b c` via x' y"
