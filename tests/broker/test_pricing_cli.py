"""``jupyter relay pricing`` (issue 16 item 5): the table the broker charges by — list prices merged with
``c.RelayApp.pricing`` — and which entry prices a model id; a bad override is one line, exit 2. Run as the
real command (a subprocess of ``python -m relay_jupyter.cli``) in a private Jupyter config dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from relay_jupyter.core.pricing import Pricing


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JUPYTER_"))}
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    return subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "pricing", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def test_the_table_with_overrides_and_which_entry_prices_a_model(tmp_path: Path) -> None:
    overrides = {"claude-haiku-4-5": {"input": 0.5}, "my-local": {"input": 0, "output": 0}}
    config = tmp_path / "relay.json"
    config.write_text(json.dumps({"pricing": overrides}))
    done = _run(tmp_path, "--config", str(config), "--json", "--model", "claude-haiku-4-5-20251001",
                "--model", "my-local", "--model", "gpt-unknown")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["prices"] == Pricing(overrides).table()
    assert out["prices"]["claude-haiku-4-5"]["input"] == 0.5 and out["prices"]["claude-haiku-4-5"]["output"] == 5.0
    assert out["models"]["claude-haiku-4-5-20251001"]["entry"] == "claude-haiku-4-5"
    assert out["models"]["my-local"] == {"entry": "my-local", "input": 0.0, "output": 0.0, "cache_write": 0.0,
                                         "cache_read": 0.0}
    worst = out["models"]["gpt-unknown"]
    assert worst["entry"].startswith("(unknown") and worst["output"] == max(p["output"] for p in out["prices"].values())
    table = _run(tmp_path, "--config", str(config))
    assert table.returncode == 0 and "my-local" in table.stdout and "USD per MTok" in table.stdout


def test_a_bad_override_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"pricing": {"cheap": {"input": -1, "output": 1}}}))
    done = _run(tmp_path, "--config", str(config))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "c.RelayApp.pricing['cheap']" in done.stderr and len(done.stderr.strip().splitlines()) == 1
