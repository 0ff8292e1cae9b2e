"""`jupyter server extension list` shows relay_jupyter enabled and valid, from the config file the wheel ships."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "jupyter-config" / "server-config" / "relay_jupyter.json"


@pytest.mark.slow
def test_shipped_config_enables_the_extension(tmp_path):
    # The wheel maps jupyter-config/server-config -> etc/jupyter/jupyter_server_config.d; rebuild that
    # layout in a temporary config path so the test does not depend on how the package was installed.
    layout = tmp_path / "etc" / "jupyter" / "jupyter_server_config.d"
    layout.mkdir(parents=True)
    shutil.copy(SHIPPED, layout / SHIPPED.name)
    # `extension list` walks the user, sys-prefix and system config dirs; the user one is ours here
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(layout.parent), "JUPYTER_PLATFORM_DIRS": "0"}
    jupyter = Path(sys.executable).with_name("jupyter")
    out = subprocess.run([str(jupyter), "server", "extension", "list"], env=env, capture_output=True,
                         text=True, timeout=120)
    text = out.stdout + out.stderr
    sections = {chunk.split("\n", 1)[0].strip(): chunk for chunk in text.split("Config dir:")[1:]}
    ours = sections[str(layout.parent)]
    assert "relay_jupyter" in ours and "enabled" in ours
    assert "relay_jupyter 0.1.0" in ours and "OK" in ours
