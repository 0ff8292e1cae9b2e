"""``jupyter relay tools list | pin | unpin``: see MCP tools and pin their safety class.

- ``list`` connects to every server of ``mcp.json`` (``--no-connect``: only the file and the
  stored pins) and prints each server's state and each tool's class, pin and hints.
- ``pin server__tool read|write`` connects to that one server to compute the tool's current
  digest (command line or URL + name + description + schema) and stores the pin in the broker's
  database. A later change to any of them drops the pin.
- ``unpin server__tool`` removes a pin.

Header and env values from ``mcp.json`` are never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from ..core.errors import Code, ConfigRefusal, RoutingRefusal
from ..core.visible import visible

if TYPE_CHECKING:
    from ..mcp.config import McpConfig
    from ..mcp.registry import McpRegistry
    from ..storage.sqlite import Store

# relay_jupyter.mcp (the MCP SDK) and the store are imported by the commands that use them, not when the parser is
# built: every `jupyter relay` command builds this group's parser, and the MCP SDK alone took 3 s of `status`'s
# start-up on the loaded 2-core CI machine (python -X importtime).


class _PinnableClasses(Sequence[str]):
    """``pin``'s CLASS choices (mcp.pins.PINNABLE_CLASSES), read when a command line is checked."""

    @staticmethod
    def _values() -> list[str]:
        from ..mcp.pins import PINNABLE_CLASSES

        return [c.value for c in PINNABLE_CLASSES]

    def __getitem__(self, index: Any) -> Any:
        return self._values()[index]

    def __len__(self) -> int:
        return len(self._values())


__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``tools`` command group to ``jupyter relay``."""
    tools = subparsers.add_parser("tools", help="list MCP tools and pin their safety class",
                                  description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = tools.add_subparsers(dest="tools_command", metavar="ACTION")
    tools.set_defaults(func=lambda args: (tools.print_help(), 0)[1])

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", help="mcp.json to use (default: <jupyter config dir>/mcp.json)")
    common.add_argument("--db", metavar="PATH", help="broker database (default: <jupyter data dir>/relay/relay.db)")
    common.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a server (default 30)")

    p_list = sub.add_parser("list", parents=[common], help="servers, tools, classes and pins")
    p_list.add_argument("--no-connect", action="store_true", help="do not start servers; show config and pins")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(func=_cmd_list)

    p_pin = sub.add_parser("pin", parents=[common], help="pin server__tool to read or write")
    p_pin.add_argument("tool", help="tool name as the model sees it: server__tool")
    p_pin.add_argument("tool_class", choices=_PinnableClasses(), metavar="CLASS",
                       help="read | write")
    p_pin.set_defaults(func=_cmd_pin)

    p_unpin = sub.add_parser("unpin", parents=[common], help="remove the pin of server__tool")
    p_unpin.add_argument("tool")
    p_unpin.set_defaults(func=_cmd_unpin)

    token = subparsers.add_parser(
        "mcp-token", help="a token for another MCP client (Claude Code, Cursor) to use relay's gated MCP endpoint",
        description="Mint a token for relay's MCP gateway ({base_url}relay/mcp), scoped to one notebook's grant. "
                    "Every call still meets the gate: grant, allowlist, budget, class, consent (in the side "
                    "panel), audit. The token is shown once; only its SHA-256 digest is stored (0600).")
    token.add_argument("--notebook", metavar="PATH", help="the notebook (path under the Jupyter root) whose grant "
                                                          "the client gets")
    token.add_argument("--client", metavar="NAME", help="instead of --notebook: the standalone daemon's client NAME "
                                                        "(origin daemon:NAME, its grant; that client answers the "
                                                        "consent cards over the daemon's RPC)")
    token.add_argument("--label", default="client", help="a name for the client (shown in --list)")
    token.add_argument("--days", type=float, default=30.0, help="days until the token expires (0: never)")
    token.add_argument("--url", default="http://127.0.0.1:8888/relay/mcp", help="the gateway URL to print")
    token.add_argument("--list", action="store_true", help="list tokens (digest prefixes, origins, expiry)")
    token.add_argument("--revoke", metavar="DIGEST_PREFIX|all", help="revoke one token (by --list's prefix) or all")
    token.add_argument("--data-dir", metavar="PATH", help="relay data dir (default: <jupyter data dir>/relay)")
    token.set_defaults(func=_cmd_mcp_token)

    from .mcp_signin import register as register_signin

    register_signin(subparsers)  # jupyter relay mcp-signin SERVER (OAuth at a terminal, for the daemon)


def _cmd_mcp_token(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from ..broker.mcp_gateway import mint_token, read_tokens, revoke_tokens, tokens_file
    from ..storage.paths import data_dir

    path = tokens_file(Path(args.data_dir) if args.data_dir else data_dir())
    if args.list:
        for digest, entry in sorted(read_tokens(path).items(), key=lambda kv: kv[1].get("created_at", 0)):
            expires = entry.get("expires_at")
            when = time.strftime("%Y-%m-%d", time.gmtime(expires)) if expires else "never"
            print(f"{digest[:12]}  {entry.get('origin')}  {entry.get('label')}  expires {when}")
        return 0
    if args.revoke:
        if args.revoke == "all":
            gone = revoke_tokens(path)
        elif len(args.revoke) >= 8 and all(c in "0123456789abcdef" for c in args.revoke.lower()):
            gone = revoke_tokens(path, digest_prefix=args.revoke)
        else:
            raise ConfigRefusal(Code.CONFIG_INVALID, "--revoke takes a digest prefix from --list (8+ hex digits) or all")
        print(f"revoked {gone} token(s)")
        return 0
    if args.client is not None:
        from ..server.daemon_auth import CLIENT_NAME

        if args.notebook or not CLIENT_NAME.match(args.client):
            raise ConfigRefusal(Code.CONFIG_INVALID, "--client takes a daemon client name ([A-Za-z0-9_.:-], up to 64), "
                                                     "not with --notebook")
        origin = f"daemon:{args.client}"
    else:
        if not args.notebook:
            raise ConfigRefusal(Code.CONFIG_INVALID,
                                "--notebook PATH is required (the notebook whose grant the client gets)")
        notebook = args.notebook.strip().lstrip("/")
        if not notebook or "\x00" in notebook or ".." in Path(notebook).parts or len(notebook) > 1024:
            raise ConfigRefusal(Code.CONFIG_INVALID, "--notebook must be a path under the Jupyter root")
        origin = f"notebook:{notebook}"
    secret = mint_token(path, origin, label=args.label, expires_in=args.days * 86400 or None)
    print(f"token for {origin} (shown once; relay keeps only its digest):\n{secret}\n")
    print(f'claude mcp add --transport http relay {args.url} --header "Authorization: Bearer {secret}"')
    return 0


def _only(config: McpConfig, server: str) -> McpConfig:
    from ..mcp.config import McpConfig

    if server not in config.servers:
        why = config.problems.get(server)
        if why:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"MCP server {server!r} is not usable: {why}")
        if server in config.disabled:
            raise ConfigRefusal(Code.CONFIG_INVALID, f"MCP server {server!r} is disabled in {config.path}")
        raise RoutingRefusal(Code.NOT_FOUND, f"no MCP server named {server!r} in {config.path}")
    return McpConfig(servers={server: config.servers[server]}, path=config.path)


def _registry(config: McpConfig, store: Store | None, timeout: float) -> McpRegistry:
    from ..mcp.registry import McpRegistry

    registry = McpRegistry(config, store, connect_timeout=timeout, call_timeout=timeout)
    # machine-client servers (mcp.json client_id): their secret from the relay secrets file, as in the broker
    from ..backends.keys import KeySource
    from ..server.jupyter_config import broker_settings_from_files

    try:
        secrets_file = broker_settings_from_files().get("secrets_file")
    except ConfigRefusal:  # a broken Jupyter config: such a server then says its secret is missing
        secrets_file = None
    registry.enable_client_credentials(lambda entry: KeySource({}, secrets_file, env={}).get(entry))
    return registry


def _cmd_pin(args: argparse.Namespace) -> int:
    from ..mcp.config import load_config
    from ..mcp.discovery import split_name
    from ..storage.sqlite import Store

    parts = split_name(args.tool)
    if parts is None:
        raise ConfigRefusal(Code.CONFIG_INVALID, f"{args.tool!r} is not an MCP tool name (expected server__tool)")
    config = _only(load_config(args.config), parts[0])
    store = Store.open(args.db)
    try:
        async def pin() -> Any:
            async with _registry(config, store, args.timeout) as reg:
                status = reg.status()[0]
                if status.state != "connected":
                    raise ConfigRefusal(Code.CONFIG_INVALID, status.error or f"MCP server {parts[0]!r} is unavailable")
                return reg.pin(args.tool, args.tool_class)

        spec = asyncio.run(pin())
    finally:
        store.close()
    note = "" if spec.tool_class.value == args.tool_class else f" (its annotations make it {spec.tool_class.value})"
    print(f"pinned {spec.name} as {args.tool_class}{note}; digest {spec.digest[:12]}")
    return 0


def _cmd_unpin(args: argparse.Namespace) -> int:
    from ..mcp.discovery import split_name
    from ..storage.sqlite import Store

    store = Store.open(args.db)
    try:
        parts = split_name(args.tool)
        removed = parts is not None and store.delete_pin(*parts)
    finally:
        store.close()
    print(f"unpinned {args.tool}" if removed else f"{args.tool} was not pinned")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from ..mcp.config import load_config
    from ..mcp.discovery import qualified_name
    from ..mcp.versions import version_note
    from ..storage.sqlite import Store

    config = load_config(args.config)
    store = Store.open(args.db)
    try:
        pins = {(p["server"], p["tool"]): p for p in store.list_pins()}  # keyed by (server, tool), never joined
        if args.no_connect:
            reg = _registry(config, store, args.timeout)
            servers, tools = [s.as_dict() for s in reg.status()], []
        else:
            async def collect() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
                async with _registry(config, store, args.timeout) as reg:
                    return [s.as_dict() for s in reg.status()], [
                        {"name": s.name, "class": s.tool_class.value, "server": s.server,
                         "pinned": s.key in pins and store.get_pin(*s.key) is not None,
                         "hints": s.hints, "description": s.description}
                        for s in reg.specs()
                    ]

            servers, tools = asyncio.run(collect())
        # Re-read: connecting may have dropped stale pins.
        pins_now = [{**p, "name": qualified_name(p["server"], p["tool"]), "tool_class": str(p["tool_class"])}
                    for p in store.list_pins()]
    finally:
        store.close()
    for s in servers:
        s["protocol_note"] = version_note(s.get("protocol_version"))
    if args.json:
        print(json.dumps({"config": config.path, "problems": config.problems.get(""),
                          "servers": servers, "tools": tools, "pins": pins_now}, indent=2, default=str))
        return 0
    # names, states, errors and hints come from MCP servers (and mcp.json): a terminal escape or bidi
    # override in them is shown as <U+XXXX>, never obeyed by the user's terminal
    show = partial(visible, newlines=False)
    print(f"MCP config: {show(str(config.path))}")
    if config.problems.get(""):
        print(f"  note: {show(str(config.problems['']))}")
    for s in servers:
        detail = s["error"] or (f"{s['tools']} tools, protocol {s['protocol_version']}" if s["state"] == "connected"
                                else "")
        print(f"  {show(str(s['name'])):<20} {show(str(s['state'])):<10} {show(str(s['source']))}"
              + (f"\n    {show(str(detail))}" if detail else ""))
        if s["state"] == "connected" and version_note(s.get("protocol_version")):
            print(f"    note: {show(str(version_note(s['protocol_version'])))}")
        for problem in s.get("problems") or []:
            print(f"    skipped: {show(str(problem))}")
    if tools:
        print("tools:")
        for t in tools:
            hints = ", ".join(f"{k}={v}" for k, v in t["hints"].items() if k != "title")
            pin = " (pinned)" if t["pinned"] else ""
            print(f"  {show(str(t['name'])):<40} {t['class']:<6}{pin}" + (f"  hints: {show(hints)}" if hints else ""))
    dropped = sorted(set(pins) - {(p["server"], p["tool"]) for p in pins_now})
    for server, tool in dropped:
        print(f"pin dropped: {show(qualified_name(server, tool))} changed since it was pinned (it is write again)")
    if not args.no_connect:
        return 0
    for p in pins_now:
        print(f"pin: {p['name']} -> {p['tool_class']} (digest {p['digest'][:12]})")
    return 0
