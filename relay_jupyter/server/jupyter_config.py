"""One configuration for both brokers: the standalone daemon reads ``c.RelayApp.*`` from the same Jupyter
config files as the server extension (issue 19 item 3).

A daemon started on demand (VS Code, nbclient, papermill, terminal IPython) used to ignore the user's
``jupyter_server_config.py`` and stay on the demo backend although ``c.RelayApp.openai_base_url`` was set.
Now :func:`broker_settings_from_files` loads, from every directory of ``jupyter --paths``' config list
(lowest priority first, so the user's own ``~/.jupyter`` wins, as in Jupyter):

- ``jupyter_server_config.d/*.json`` (what installed packages drop in),
- ``jupyter_server_config.json`` / ``.py`` (the server extension's own files),
- ``jupyter_relay_config.json`` / ``.py`` (relay-only settings, read by the daemon and by ``RelayApp``'s
  config name as well),

builds the ``RelayApp`` traits from them with traitlets (the same trait types, defaults and validation as
inside Jupyter) and returns only the settings the files named, as :class:`~relay_jupyter.broker.config.
BrokerConfig` values. The daemon's ``--config`` JSON and flags override them.

traitlets' own loaders do the parsing (``.py`` files are the user's own Python, executed as Jupyter does).

``--RelayApp.<name>=value`` on a ``jupyter relay`` command line (``cli/app.py``) is set for the command's duration
with :func:`command_line_config` and wins over the files here, as a Jupyter application's command line does.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_config_path
from traitlets import TraitError
from traitlets.config import Config
from traitlets.config.loader import ConfigFileNotFound, JSONFileConfigLoader, PyFileConfigLoader

from ..broker.config import BrokerConfig
from ..core.errors import Code, ConfigRefusal

__all__ = ["CONFIG_NAMES", "broker_settings_from_files", "command_line_config", "command_line_settings", "config_files",
           "load_jupyter_config"]

#: Base names of the config files read from each Jupyter config directory, in order.
CONFIG_NAMES = ("jupyter_server_config", "jupyter_relay_config")

_log = logging.getLogger(__name__)
_COMMAND_LINE: ContextVar[Config | None] = ContextVar("relay_command_line_config", default=None)


@contextlib.contextmanager
def command_line_config(config: Config) -> Iterator[None]:
    """The traitlets config of a ``jupyter relay`` command line (``--RelayApp.x=y``), over the files meanwhile."""
    token = _COMMAND_LINE.set(config)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def _settings_of(config: Config, where: str) -> dict[str, Any]:
    section = config.get("RelayApp") if "RelayApp" in config else None
    if not section:
        return {}
    # the extension's traits (one definition of every setting), without the extension: server/app.py imports
    # jupyter_server, seconds of a daemon's start for settings it only reads (server/settings.py)
    from .settings import RelayApp

    try:
        full = RelayApp(config=config).broker_config()
    except TraitError as exc:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"c.RelayApp in {where}: {str(exc).splitlines()[0][:300]}") from None
    except ConfigRefusal:
        raise
    except ValueError as exc:  # pydantic: BrokerConfig refused a combination of values
        raise ConfigRefusal(Code.CONFIG_INVALID, f"c.RelayApp: {str(exc).splitlines()[0][:300]}") from None
    return {name: getattr(full, name) for name in section if name in BrokerConfig.model_fields}


def command_line_settings() -> dict[str, Any]:
    """``BrokerConfig`` values for the ``--RelayApp.*`` of the current command line (empty outside one)."""
    config = _COMMAND_LINE.get()
    return _settings_of(config, "the command line") if config is not None else {}


def config_files(paths: Iterable[str | Path] | None = None) -> list[Path]:
    """The files read, lowest priority first (``jupyter_config_path()`` lists the highest first)."""
    dirs = [Path(p) for p in (jupyter_config_path() if paths is None else paths)]
    found: list[Path] = []
    for directory in reversed(dirs):
        confd = directory / "jupyter_server_config.d"
        if confd.is_dir():
            found += sorted(f for f in confd.glob("*.json") if f.is_file())
        for name in CONFIG_NAMES:
            for ext in (".json", ".py"):
                file = directory / f"{name}{ext}"
                if file.is_file():
                    found.append(file)
    return found


def load_jupyter_config(paths: Iterable[str | Path] | None = None) -> tuple[Config, list[Path]]:
    """The merged traitlets config of :func:`config_files`, and the files it came from.

    Raises:
        ConfigRefusal: CONFIG_INVALID naming a file that does not parse or raises when executed.
    """
    config = Config()
    files = config_files(paths)
    for file in files:
        loader_cls = JSONFileConfigLoader if file.suffix == ".json" else PyFileConfigLoader
        try:
            config.merge(loader_cls(file.name, path=str(file.parent)).load_config())
        except ConfigFileNotFound:
            continue  # removed between listing and reading
        except Exception as exc:  # noqa: BLE001 - a user's config file can raise anything; one line, no traceback
            raise ConfigRefusal(Code.CONFIG_INVALID,
                                f"{file}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                                ) from None
    return config, files


def broker_settings_from_files(paths: Iterable[str | Path] | None = None, *,
                               command_line: bool = True) -> dict[str, Any]:
    """``BrokerConfig`` values for the ``c.RelayApp.*`` settings the Jupyter config files name, with the current
    command line's ``--RelayApp.*`` over them (unless ``command_line`` is false or ``paths`` are given).

    Raises:
        ConfigRefusal: CONFIG_INVALID for a broken file or a value the ``RelayApp`` trait refuses.
    """
    config, files = load_jupyter_config(paths)
    cli = _COMMAND_LINE.get() if command_line and paths is None else None
    for file in files:
        _log.debug("relay: config file %s", file)
    if cli is not None:
        config.merge(cli)
    where = ", ".join(str(f) for f in files) + (" and the command line" if cli else "")
    return _settings_of(config, where or "the command line")
