"""Daemon start (issue 19): what a kernel that finds no daemon waits for before its first cell goes on.

Wall time from spawning the kernel's own daemon command (``python -m relay_jupyter.cli serve --listen unix://...
--idle-timeout 600``, as ``kernel/discovery.py daemon_command``) to the first ``200`` of ``/relay/healthz`` on its
socket, with no Jupyter config file and with one ``c.RelayApp`` setting in ``jupyter_server_config.py``.
Each tree given (a directory holding a ``relay_jupyter`` package, e.g. ``git archive <commit> relay_jupyter``) is
put first on ``PYTHONPATH``; the trees alternate within every round (interleaved), one warm-up start per tree
writes its ``.pyc`` files first (not counted), and the medians of the rounds are printed with the load average.

    python benchmarks/bench_daemon_start.py [--rounds 5] TREE [TREE ...]

Under ``benchmarks/run.py`` (``run(report)``): this checkout's start, both cases, against the floor of any such
start, a bare Python process that binds the same kind of socket and answers ``healthz`` (no target).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {"no config file": None, "c.RelayApp setting in jupyter_server_config.py": "c.RelayApp.consent_timeout = 120\n"}


def _answers(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(str(path))
            sock.sendall(b"GET /relay/healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            return sock.recv(100).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def start_once(tree: str, config: str | None) -> float:
    """Seconds from spawning the daemon to its first healthz answer (the daemon is then stopped)."""
    root = Path(tempfile.mkdtemp(prefix="relay-bench-start-"))
    env = {k: v for k, v in os.environ.items() if k not in ("RELAY_URL", "ANTHROPIC_API_KEY", "PYTHONDONTWRITEBYTECODE")}
    env.update(PYTHONPATH=tree, JUPYTER_DATA_DIR=str(root / "data"), JUPYTER_RUNTIME_DIR=str(root / "rt"),
               JUPYTER_CONFIG_DIR=str(root / "cfg"))
    (root / "cfg").mkdir()
    if config:
        (root / "cfg" / "jupyter_server_config.py").write_text(config)
    sock = root / "rt" / "relay" / "relay.sock"
    sock.parent.mkdir(parents=True, mode=0o700)
    cmd = [sys.executable, "-m", "relay_jupyter.cli", "serve", "--listen", f"unix://{sock}", "--idle-timeout", "600"]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not _answers(sock):
            if proc.poll() is not None:
                raise SystemExit(f"{tree}: the daemon exited with {proc.returncode}")
            time.sleep(0.01)  # a socket another process creates: nothing to wait on but polling
        return time.monotonic() - started
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)


_FLOOR = """
import os, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX); srv.bind(path); srv.listen(8)
while True:
    conn, _ = srv.accept(); conn.recv(4096)
    conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok"); conn.close()
"""


def floor_once() -> float:
    """Seconds from spawning a bare Python socket server to its first answer: what no daemon can beat."""
    root = Path(tempfile.mkdtemp(prefix="relay-bench-floor-"))
    sock = root / "floor.sock"
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _FLOOR, str(sock)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while not _answers(sock):
            if proc.poll() is not None:
                raise SystemExit(f"the floor server exited with {proc.returncode}")
            time.sleep(0.01)
        return time.monotonic() - started
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)


def run(report) -> None:  # noqa: ANN001 - benchmarks/run.py's report callable
    tree = str(Path(__file__).resolve().parents[1])
    start_once(tree, None)
    got: dict[str, list[float]] = {case: [] for case in CASES}
    floor: list[float] = []
    for _ in range(3):
        floor.append(floor_once())
        for case, config in CASES.items():
            got[case].append(start_once(tree, config))
    for case in CASES:
        report(f"daemon start to healthz, {case}, vs a bare Python socket server", statistics.median(got[case]) * 1000,
               statistics.median(floor) * 1000, "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("trees", nargs="+")
    args = parser.parse_args()
    for tree in args.trees:
        start_once(tree, None)
    times: dict[tuple[str, str], list[float]] = {(t, c): [] for t in args.trees for c in CASES}
    load = os.getloadavg()[0]
    for _ in range(args.rounds):
        for case, config in CASES.items():
            for tree in args.trees:
                times[(tree, case)].append(start_once(tree, config))
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}, {args.rounds} rounds, interleaved")
    for case in CASES:
        for tree in args.trees:
            got = times[(tree, case)]
            print(f"{case}: {tree}: median {statistics.median(got) * 1000:.0f} ms "
                  f"({', '.join(f'{t * 1000:.0f}' for t in got)})")


if __name__ == "__main__":
    main()
