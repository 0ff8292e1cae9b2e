"""Where relay keeps its data: ``<jupyter data dir>/relay`` (``JUPYTER_DATA_DIR`` moves it)."""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_core.paths import jupyter_config_dir, jupyter_data_dir, jupyter_runtime_dir

__all__ = ["data_dir", "config_dir", "runtime_dir", "ensure_private_dir"]


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it 0700. Returns it."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def data_dir(create: bool = True) -> Path:
    """``relay/`` under the Jupyter data dir, private to the user."""
    path = Path(jupyter_data_dir()) / "relay"
    return ensure_private_dir(path) if create else path


def config_dir() -> Path:
    return Path(jupyter_config_dir())


def runtime_dir() -> Path:
    return Path(jupyter_runtime_dir())
