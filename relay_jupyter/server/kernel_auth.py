"""Per-kernel credentials and the scrubbed kernel environment.

Every kernel this Jupyter server starts gets, in its environment, ``RELAY_URL`` (the absolute URL of
``.../relay/``) and ``RELAY_KERNEL_CREDENTIAL`` (32 random bytes, base64url), which it sends as
``Authorization: RelayKernel <credential>``. The broker maps the credential to the kernel id and
the kernel id to its notebook (the session manager's kernel -> path map): that is the origin. A
kernel never names its own origin.

Kernels inherit the server's environment by default, so the broker's secrets are removed from
every kernel's environment: the configured variable names (model keys, every Jupyter/JupyterHub
token), and any variable whose value contains a configured secret value (a key copied under
another name, the server's own token).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AUTH_SCHEME",
    "ENV_CREDENTIAL",
    "ENV_URL",
    "KernelCredentials",
    "KernelIdentity",
    "install_kernel_env_hook",
    "install_kernel_lifecycle_hook",
    "scrub_env",
]

logger = logging.getLogger(__name__)

ENV_URL = "RELAY_URL"
ENV_CREDENTIAL = "RELAY_KERNEL_CREDENTIAL"
AUTH_SCHEME = "RelayKernel"
_MIN_SECRET_LEN = 8  # shorter "secrets" would scrub innocent variables by value


@dataclass(frozen=True)
class KernelIdentity:
    kernel_id: str


def _digest(credential: str) -> str:
    return hashlib.sha256(credential.encode("utf-8", "surrogatepass")).hexdigest()


class KernelCredentials:
    """Issues one credential per kernel and resolves a presented credential to its kernel id.

    Only SHA-256 digests are kept, so a memory dump of this table does not give usable credentials,
    and lookup is by digest (a dict lookup on a hash leaks nothing usable about the credential).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_digest: dict[str, str] = {}
        self._by_kernel: dict[str, str] = {}

    def issue(self, kernel_id: str) -> str:
        """A fresh credential for ``kernel_id`` (replacing any earlier one)."""
        credential = secrets.token_urlsafe(32)
        digest = _digest(credential)
        with self._lock:
            old = self._by_kernel.pop(kernel_id, None)
            if old is not None:
                self._by_digest.pop(old, None)
            self._by_digest[digest] = kernel_id
            self._by_kernel[kernel_id] = digest
        return credential

    def resolve(self, credential: str) -> str | None:
        """The kernel id of ``credential``, or None."""
        if not credential or len(credential) > 256:
            return None
        digest = _digest(credential)
        with self._lock:
            kernel_id = self._by_digest.get(digest)
            # constant-time confirmation of the table entry (defence in depth against a broken dict)
            if kernel_id is None or not hmac.compare_digest(self._by_kernel.get(kernel_id, ""), digest):
                return None
            return kernel_id

    def revoke(self, kernel_id: str) -> None:
        """Forget the credential of ``kernel_id`` (the kernel is gone)."""
        with self._lock:
            digest = self._by_kernel.pop(kernel_id, None)
            if digest is not None:
                self._by_digest.pop(digest, None)

    def kernels(self) -> list[str]:
        with self._lock:
            return list(self._by_kernel)


def scrub_env(env: Mapping[str, str], *, names: Iterable[str], values: Iterable[str]) -> dict[str, str]:
    """A copy of ``env`` without the secret ``names`` and without any variable whose value contains
    one of the secret ``values`` (case-insensitively for names)."""
    drop = {n.upper() for n in names}
    secret_values = [v for v in values if v and len(v) >= _MIN_SECRET_LEN]
    out: dict[str, str] = {}
    for key, value in env.items():
        if key.upper() in drop:
            continue
        if any(s in value for s in secret_values):
            continue
        out[key] = value
    # our own variables are set fresh by the caller; never pass through inherited ones
    out.pop(ENV_URL, None)
    out.pop(ENV_CREDENTIAL, None)
    return out


def install_kernel_env_hook(kernel_manager: Any, credentials: KernelCredentials, *,
                            relay_url: Callable[[], str], secret_names: Callable[[], Iterable[str]],
                            secret_values: Callable[[], Iterable[str]]) -> None:
    """Wrap ``kernel_manager.start_kernel`` so every new kernel gets a scrubbed env and its credential.

    The wrapper picks the kernel id itself (when none is given) so the credential can be bound to
    it before launch. A restart reuses the launch environment, hence the same credential; a kernel
    shut down loses its credential (checked at every request, see ``resolve`` in the handlers).
    """
    original = kernel_manager.start_kernel
    if getattr(original, "_relay_wrapped", False):
        return

    async def start_kernel(*args: Any, kernel_id: str | None = None, **kwargs: Any) -> str:
        if kernel_id is not None and kernel_id in kernel_manager:
            return await original(*args, kernel_id=kernel_id, **kwargs)  # an existing kernel: nothing new
        if kernel_id is None:
            kernel_id = kernel_manager.new_kernel_id()
        base = kwargs.get("env")
        env = scrub_env(os.environ if base is None else base, names=secret_names(), values=secret_values())
        env[ENV_URL] = relay_url()
        env[ENV_CREDENTIAL] = credentials.issue(kernel_id)
        kwargs["env"] = env
        try:
            return await original(*args, kernel_id=kernel_id, **kwargs)
        except BaseException:
            credentials.revoke(kernel_id)
            raise

    start_kernel._relay_wrapped = True  # type: ignore[attr-defined]
    kernel_manager.start_kernel = start_kernel


def install_kernel_lifecycle_hook(kernel_manager: Any, on_end: Callable[[str, str], None]) -> None:
    """Call ``on_end(kernel_id, reason)`` the moment a kernel's life as the originator of its runs ends.

    ``reason`` is ``"restarted"`` or ``"shut down"`` (the kernel manager's ``restart_kernel`` /
    ``shutdown_kernel``, which the REST API, the session manager and the idle culler all use), or
    ``"died"`` (jupyter_client's restarter found the process gone: its ``restart`` callback before
    the automatic restart, ``dead`` when it gives up). Called *before* the kernel goes, on the
    server's event loop; a failing ``on_end`` is logged, never blocks the kernel action.

    jupyter_server also emits ``kernel_actions`` events through its event logger, but only after
    an action succeeded and only for API actions: not for a kernel that died. Hence wrappers plus
    the restarter's callbacks.
    """
    if getattr(kernel_manager, "_relay_lifecycle", False):
        return
    kernel_manager._relay_lifecycle = True

    def fire(kernel_id: str, reason: str) -> None:
        try:
            on_end(kernel_id, reason)
        except Exception:  # noqa: BLE001 - the kernel action must go on whatever relay thinks of it
            logger.exception("relay: handling the end of kernel %s failed", kernel_id)

    original_start = kernel_manager.start_kernel
    original_shutdown = kernel_manager.shutdown_kernel
    original_restart = kernel_manager.restart_kernel

    def watch(kernel_id: str) -> None:
        add = getattr(kernel_manager, "add_restart_callback", None)
        if add is None:
            return
        try:
            add(kernel_id, lambda: fire(kernel_id, "died"), "restart")
            add(kernel_id, lambda: fire(kernel_id, "died"), "dead")
        except Exception:  # noqa: BLE001 - a kernel without a restarter still has shutdown/restart hooks
            logger.debug("relay: no restart callbacks for kernel %s", kernel_id)

    async def start_kernel(*args: Any, **kwargs: Any) -> str:
        known = kwargs.get("kernel_id") is not None and kwargs["kernel_id"] in kernel_manager
        kernel_id = await original_start(*args, **kwargs)
        if not known:
            watch(kernel_id)
        return kernel_id

    async def shutdown_kernel(kernel_id: str, *args: Any, **kwargs: Any) -> Any:
        fire(kernel_id, "shut down")
        return await original_shutdown(kernel_id, *args, **kwargs)

    async def restart_kernel(kernel_id: str, *args: Any, **kwargs: Any) -> Any:
        fire(kernel_id, "restarted")
        return await original_restart(kernel_id, *args, **kwargs)

    kernel_manager.start_kernel = start_kernel
    kernel_manager.shutdown_kernel = shutdown_kernel
    kernel_manager.restart_kernel = restart_kernel
