#!/bin/sh
# The venv that JupyterHub's other OS users run (tests/hub): the relay service user and the users' processes.
# Built from Debian's system python3: the project venv's Python (pyenv, in root's home, mode 0700) is not
# executable by another user. It holds relay-jupyter's dependencies, jupyterhub, psycopg (the service's
# PostgreSQL store) and JupyterLab (the users' servers in the browser test); the relay source itself
# comes from a world-readable copy the tests make (PYTHONPATH), so the code under test is always current.
# RELAY_HUB_VENV: where (default /opt/relay-test/hub-venv, mode 0755).
set -eu
VENV="${RELAY_HUB_VENV:-/opt/relay-test/hub-venv}"
SYSPY="${SYSTEM_PYTHON:-/usr/bin/python3}"
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
umask 022
mkdir -p "$(dirname "$VENV")"
"$SYSPY" -m venv "$VENV"
DEPS="$("$VENV/bin/python" -c '
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    meta = tomllib.load(f)["project"]
extras = meta["optional-dependencies"]
# JupyterLab (as pinned in the lab extra) for the browser login through the hub (tests/hub/test_hub_browser.py)
lab = [d for d in extras["lab"] if d.startswith("jupyterlab")]
print("\n".join(meta["dependencies"] + extras["hub"] + extras["postgres"] + lab))
' "$HERE/pyproject.toml")"
echo "$DEPS" > "$VENV/relay-requirements.txt"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$VENV/relay-requirements.txt"
chmod -R a+rX "$VENV"
