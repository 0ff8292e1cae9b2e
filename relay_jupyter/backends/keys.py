"""Where backend API keys come from: the server's configuration, a private secrets file, or the
server process's environment — in that order. Never from a kernel, a request, or a model.

The secrets file is JSON ``{"anthropic": "sk-…", "openai": "…"}``. It must be a regular file
owned by this user with no group or world permission bits (0600 or stricter); anything else is
refused with a message that says how to fix it, and its contents are never read. Keys are held
in :class:`Secret`, whose ``repr``/``str`` never show the value.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ..core.errors import Code, ConfigRefusal
from .registry import key_env_names

__all__ = ["Secret", "KeySource", "ENV_NAMES"]

#: Environment variable of the server process consulted last, per backend (declared in ``registry.py``).
ENV_NAMES: dict[str, str] = dict(key_env_names())

_MAX_SECRETS_FILE = 64 * 1024


class Secret:
    """A key. ``reveal()`` is the only way to the value; printing it shows ``Secret(****)``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The key itself: hand it to an SDK client, nowhere else."""
        return self._value

    def __repr__(self) -> str:
        return "Secret(****)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class KeySource:
    """Resolves the key for a backend name (``anthropic``, ``openai``, or a configured name)."""

    def __init__(self, config_keys: Mapping[str, str] | None = None, secrets_file: str | os.PathLike[str] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self._config = {k: v for k, v in (config_keys or {}).items() if v}
        self._file = Path(secrets_file) if secrets_file else None
        self._env = os.environ if env is None else env

    def __repr__(self) -> str:
        return f"KeySource(config={sorted(self._config)!r}, secrets_file={str(self._file)!r})"

    def get(self, backend: str) -> Secret | None:
        """The key for ``backend`` or None when no source has one.

        Raises:
            ConfigRefusal(NO_CREDENTIALS): the secrets file exists but is unsafe or unreadable.
        """
        if backend in self._config:
            return Secret(self._config[backend])
        if self._file is not None:
            value = self._from_file(backend)
            if value:
                return Secret(value)
        env_name = ENV_NAMES.get(backend)
        if env_name and self._env.get(env_name):
            return Secret(self._env[env_name])
        return None

    def require(self, backend: str) -> Secret:
        """Like :meth:`get`, but a missing key is a ``NO_CREDENTIALS`` refusal naming where to put one."""
        key = self.get(backend)
        if key is None:
            where = f" or ${ENV_NAMES[backend]} in the server's environment" if backend in ENV_NAMES else ""
            raise ConfigRefusal(Code.NO_CREDENTIALS,
                                f"no API key for backend {backend!r}: set it in the server config, "
                                f"the relay secrets file (mode 0600){where}")
        return key

    def _from_file(self, backend: str) -> str | None:
        path = self._file
        assert path is not None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigRefusal(Code.NO_CREDENTIALS,
                                f"cannot open the secrets file {path} ({exc.strerror}); it must be a "
                                "regular file, not a symlink") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ConfigRefusal(Code.NO_CREDENTIALS, f"the secrets file {path} is not a regular file")
            if st.st_mode & 0o077:
                raise ConfigRefusal(
                    Code.NO_CREDENTIALS,
                    f"the secrets file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                    f"run: chmod 600 {path}")
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                raise ConfigRefusal(Code.NO_CREDENTIALS, f"the secrets file {path} is not owned by this user")
            raw = os.read(fd, _MAX_SECRETS_FILE + 1)
        finally:
            os.close(fd)
        if len(raw) > _MAX_SECRETS_FILE:
            raise ConfigRefusal(Code.NO_CREDENTIALS, f"the secrets file {path} is too large")
        try:
            data = json.loads(raw)
        except ValueError:
            # Do not echo the parser message: it can quote part of a key.
            raise ConfigRefusal(Code.NO_CREDENTIALS, f"the secrets file {path} is not valid JSON") from None
        if not isinstance(data, dict):
            raise ConfigRefusal(Code.NO_CREDENTIALS, f"the secrets file {path} must hold a JSON object")
        value = data.get(backend)
        return value if isinstance(value, str) and value else None
