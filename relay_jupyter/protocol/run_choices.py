"""The names ``run.start`` accepts for ``backend`` and ``engine``: plain Literals and tuples, no pydantic
(the kernel's ``%%agent`` parser imports this module and must stay light).

``backends/registry.py`` and ``runtime/engine.py`` (with ``engines/``) declare each backend and engine and
assert at import that their lists are exactly these, so one is added there and here, nowhere else.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["BACKEND_NAMES", "BackendName", "ENGINE_NAMES", "EngineName", "PROFILE_NAME_PATTERN"]

#: The model backends, in the registry's order.
BackendName = Literal["anthropic", "openai", "demo"]
BACKEND_NAMES: tuple[str, ...] = get_args(BackendName)

#: The run engines: ``relay`` (the built-in loop over a backend) and ``claude-code`` (Claude Code through
#: claude-agent-sdk, an optional extra). Declared in ``engines/registry.py``.
EngineName = Literal["relay", "claude-code"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)

#: The one pattern of a profile name (``c.RelayApp.profiles``, broker/profiles.py; ``run.start``'s ``profile``;
#: ``%%agent --profile``).
PROFILE_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,32}$"
