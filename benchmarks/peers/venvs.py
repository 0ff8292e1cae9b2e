"""The peers' own virtual environments, created on first use.

jupyter-ai pins other anthropic/openai/langchain majors than relay-jupyter, so each peer lives in a
venv of its own under ``benchmarks/.peers/`` (git-ignored). A venv is (re)built when its marker file
is missing or names other requirements than :data:`PEERS` does now.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PEERS", "PEER_DIR", "Peer", "ensure"]

PEER_DIR = Path(__file__).resolve().parent.parent / ".peers"
_MARKER = ".relay-bench-installed"


@dataclass(frozen=True)
class Peer:
    """One peer venv: its name, pinned requirements and the extension ``%load_ext`` loads."""

    name: str
    requirements: tuple[str, ...]
    extension: str

    @property
    def path(self) -> Path:
        return PEER_DIR / self.name

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


PEERS: dict[str, Peer] = {
    # jupyter-ai 2.x: the magics package on its own; langchain-anthropic supplies `anthropic-chat:`
    "v2": Peer("v2", ("jupyter-ai-magics==2.31.7", "langchain-anthropic", "ipykernel"), "jupyter_ai_magics"),
    # jupyter-ai 3.2.0's `magics` extra pins exactly these two (litellm underneath)
    "v3": Peer("v3", ("jupyter-ai-magic-commands==0.0.4", "jupyter-ai-litellm==0.1.0", "ipykernel"),
               "jupyter_ai_magic_commands"),
}


def _installed(peer: Peer) -> bool:
    marker = peer.path / _MARKER
    try:
        return peer.python.exists() and marker.read_text() == "\n".join(peer.requirements)
    except OSError:
        return False


def ensure(peer: Peer, *, log=print) -> Path:
    """The peer's Python, after creating its venv and installing its requirements when needed.

    Raises:
        SystemExit: pip failed (its output is shown).
    """
    if _installed(peer):
        return peer.python
    log(f"installing peer {peer.name} into {peer.path} ({', '.join(peer.requirements)}) ...")
    peer.path.parent.mkdir(parents=True, exist_ok=True)
    # the same interpreter version as ours, so a difference cannot come from Python itself
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(peer.path)], check=True)
    done = subprocess.run([str(peer.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           *peer.requirements], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pip could not install peer {peer.name}:\n{done.stdout}\n{done.stderr}")
    (peer.path / _MARKER).write_text("\n".join(peer.requirements))
    return peer.python
