"""``jupyter relay token rotate [--kernel-key [--grace S]] | path``: the standalone daemon's TCP bearer token
(or its kernel credential key).

The token lives in ``<data dir>/daemon_token`` (0600). ``rotate`` replaces it atomically; a running
daemon notices within a second, refuses the old token from then on and closes event streams
opened with it. The token is never printed: clients read the file (or ``RELAY_TOKEN``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..core.errors import Code, ConfigRefusal
from ..storage.paths import data_dir, ensure_private_dir

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``token`` command group to ``jupyter relay``."""
    p = subparsers.add_parser("token", help="rotate or locate the daemon's TCP bearer token",
                              description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="token_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", metavar="PATH", help="default: <jupyter data dir>/relay")
    r = sub.add_parser("rotate", parents=[common], help="replace the token (clients with the old one get 401)")
    r.add_argument("--kernel-key", action="store_true",
                   help="rotate the key of the kernels' credentials instead (daemon_kernel_key): kernels registered "
                        "before keep working for --grace seconds, then need a restart")
    r.add_argument("--grace", metavar="SECONDS", type=float, default=None,
                   help="with --kernel-key: how long the previous key's credentials stay valid (default 86400; 0: "
                        "refused at once, for a key that leaked)")
    r.set_defaults(func=_cmd_rotate)
    w = sub.add_parser("path", parents=[common], help="print where the token file is")
    w.set_defaults(func=_cmd_path)


def _root(args: argparse.Namespace) -> Path:
    return ensure_private_dir(Path(args.data_dir)) if args.data_dir else data_dir()


def _cmd_rotate(args: argparse.Namespace) -> int:
    # server.daemon_auth (tornado, the broker's core) only when a token command runs, not when any command's
    # parser is built
    from ..server.daemon_auth import (KERNEL_KEY_FILE, KERNEL_KEY_GRACE_SECONDS, rotate_kernel_key, rotate_token,
                                      token_path)

    if args.grace is not None and not args.kernel_key:
        raise ConfigRefusal(Code.CONFIG_INVALID, "--grace is for --kernel-key only")
    if args.kernel_key:
        grace = KERNEL_KEY_GRACE_SECONDS if args.grace is None else args.grace
        key = _root(args) / KERNEL_KEY_FILE
        rotate_kernel_key(key, grace)
        print(f"rotated the kernel key in {key}; kernels registered before "
              + (f"keep working for {grace:g} s, then need a restart" if grace > 0 else "are refused from now on"))
        return 0
    path = token_path(_root(args))
    rotate_token(path)
    print(f"rotated the daemon token in {path}; clients must read it again")
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    from ..server.daemon_auth import token_path

    print(token_path(_root(args)))
    return 0
