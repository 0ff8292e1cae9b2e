"""Rotating the daemon's kernel credential key (issue 19 leftover; docs/daemon.md "Each headless notebook is its own
origin"): ``jupyter relay token rotate --kernel-key`` writes a new key and keeps the old one for a grace period, so
kernels registered before the rotation keep their origin until it ends, and only then need a restart; ``--grace 0``
(a key that leaked) refuses them at once. A previous-key file that is unsafe or malformed is no key at all (fail
closed). Real files and the real CLI; the clock is injected (no timed assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from relay_jupyter.server.daemon_auth import (KERNEL_KEY_FILE, PREVIOUS_KERNEL_KEY_FILE, KernelRegistry,
                                              rotate_kernel_key)

ORIGIN = "daemon:kernel:weekly.ipynb"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_rotation_keeps_old_credentials_for_its_grace_and_issues_under_the_new_key(tmp_path: Path) -> None:
    clock = Clock()
    key = tmp_path / KERNEL_KEY_FILE
    registry = KernelRegistry(key, clock=clock)
    old = registry.issue(ORIGIN)
    assert registry.verify(old) == ORIGIN

    rotate_kernel_key(key, 600, clock=clock)
    assert (tmp_path / PREVIOUS_KERNEL_KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert key.stat().st_mode & 0o777 == 0o600
    new = registry.issue(ORIGIN)  # the running registry noticed the rotation: a new key's credential
    assert new != old and KernelRegistry(key, clock=clock).verify(new) == ORIGIN
    assert registry.verify(old) == ORIGIN  # within the grace
    tampered = old[:-4] + ("AAAA" if not old.endswith("AAAA") else "BBBB")
    assert registry.verify(tampered) is None  # the previous key is no way around the MAC

    clock.now += 601
    assert registry.verify(old) is None  # the grace is over: that kernel needs a restart
    assert registry.verify(new) == ORIGIN

    # a second rotation: the first key is gone for good, the second one in its grace
    rotate_kernel_key(key, 600, clock=clock)
    assert registry.verify(old) is None and registry.verify(new) == ORIGIN


def test_a_rotation_without_grace_refuses_at_once_and_an_unsafe_previous_file_is_no_key(tmp_path: Path) -> None:
    clock = Clock()
    key = tmp_path / KERNEL_KEY_FILE
    registry = KernelRegistry(key, clock=clock)
    old = registry.issue(ORIGIN)
    rotate_kernel_key(key, 0, clock=clock)  # a key that leaked
    assert registry.verify(old) is None
    assert not (tmp_path / PREVIOUS_KERNEL_KEY_FILE).exists()

    second = registry.issue(ORIGIN)
    rotate_kernel_key(key, 600, clock=clock)
    previous = tmp_path / PREVIOUS_KERNEL_KEY_FILE
    assert registry.verify(second) == ORIGIN
    os.chmod(previous, 0o644)  # readable by others: refused, so the old credentials are too
    os.utime(previous, ns=(1, 1))  # a changed file is re-read
    assert registry.verify(second) is None
    os.chmod(previous, 0o600)
    previous.write_text(json.dumps({"key": 5, "until": "later"}))  # malformed: no previous key
    assert registry.verify(second) is None
    previous.write_text("{not json")
    assert registry.verify(second) is None


def test_the_cli_rotates_the_kernel_key_with_a_grace_and_refuses_grace_alone(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "JUPYTER"))}
    data = tmp_path / "relay"
    registry = KernelRegistry(data / KERNEL_KEY_FILE)
    old = registry.issue(ORIGIN)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "relay_jupyter.cli", "token", "rotate", "--data-dir", str(data),
                               *args], env=env, capture_output=True, text=True, timeout=120, check=False)

    done = cli("--kernel-key", "--grace", "3600")
    assert done.returncode == 0, done.stderr
    assert "keep working for 3600 s" in done.stdout
    assert old.rsplit(".", 1)[1] not in done.stdout + done.stderr  # nothing of a credential or key printed
    assert registry.verify(old) == ORIGIN and registry.issue(ORIGIN) != old
    refused = cli("--grace", "10")
    assert refused.returncode == 2 and "--grace is for --kernel-key only" in refused.stderr
    assert "Traceback" not in refused.stderr
