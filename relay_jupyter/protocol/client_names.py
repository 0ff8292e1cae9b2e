"""The ``X-Relay-Client`` name of a notebook's kernel: one function for the kernel (which sends it) and the
server side (the hub thin client, which names the same kernel to the hub service when it ends).

Plain standard library: the kernel imports it at ``%load_ext``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

__all__ = ["ENV_INSTANCE", "INSTANCE_HEADER", "MAX_CLIENT_NAME", "anonymous_name_for", "client_name_for", "is_instance",
           "kernel_instance", "notebook_of_env"]

_CLIENT_CHARS = re.compile(r"[^A-Za-z0-9_.:-]+")
#: The daemon's and the hub service's limit on ``X-Relay-Client`` (1-64 of ``[A-Za-z0-9_.:-]``).
MAX_CLIENT_NAME = 64


def client_name_for(path: str) -> str:
    """``X-Relay-Client`` for a notebook path: ``kernel:<path>``, fitted to the daemon's 1-64 of
    ``[A-Za-z0-9_.:-]``: other characters become ``_``, and a longer name keeps its tail (the file name) with a
    hash of the whole path in front, so two long paths never share a name. The daemon's origin is
    ``daemon:<this>``."""
    name = "kernel:" + _CLIENT_CHARS.sub("_", path).strip("_")
    if name == "kernel:":
        name = "kernel:" + hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    if len(name) > MAX_CLIENT_NAME:
        digest = hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        keep = MAX_CLIENT_NAME - len("kernel:") - len(digest) - 1
        name = f"kernel:{digest}-{name[-keep:].lstrip('_.:-') or digest}"[:MAX_CLIENT_NAME]
    return name


def notebook_of_env(env: Mapping[str, str]) -> str | None:
    """The notebook a kernel started with ``env`` will name first (``RELAY_NOTEBOOK``, else the
    ``JPY_SESSION_NAME`` a Jupyter server sets for a notebook's kernel), or None."""
    raw = env.get("RELAY_NOTEBOOK", "").strip() or env.get("JPY_SESSION_NAME", "").strip()
    return raw or None


#: A JupyterHub thin single-user server gives each kernel it starts a random instance id in this variable
#: (server/hub_service.install_thin_kernel_env_hook); the kernel sends it as :data:`INSTANCE_HEADER`, and the hub
#: service makes it part of the kernel's client id (not of its origin). So two kernels of one notebook name are two
#: clients (ending one ends only its own runs), and the thin server can name a kernel that knows no notebook.
ENV_INSTANCE = "RELAY_KERNEL_INSTANCE"
INSTANCE_HEADER = "X-Relay-Instance"
_INSTANCE = re.compile(r"[0-9a-f]{16}")


def kernel_instance(env: Mapping[str, str]) -> str | None:
    """The kernel instance id in ``env`` (:data:`ENV_INSTANCE`: 16 lowercase hex), or None (absent or malformed)."""
    value = env.get(ENV_INSTANCE, "").strip()
    return value if _INSTANCE.fullmatch(value) else None


def is_instance(value: str | None) -> bool:
    """True for a well-formed kernel instance id (what :data:`INSTANCE_HEADER` may carry)."""
    return bool(value) and bool(_INSTANCE.fullmatch(value or ""))


def anonymous_name_for(instance: str) -> str:
    """The ``X-Relay-Client`` of a kernel that knows no notebook but has an instance id: ``kernel:anon-<12 hex>``
    (the thin server computes the same name to end its runs)."""
    return "kernel:anon-" + instance[:12]
