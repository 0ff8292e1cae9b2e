"""``jupyter relay`` as a Jupyter application (issue 19 item 3).

:class:`JupyterRelayApp` is a traitlets :class:`~jupyter_core.application.JupyterApp`, as ``jupyter server`` and
``jupyter lab`` are: ``--version``, ``--debug``, ``--log-level``, ``--help-all``, ``--generate-config`` (writes
``jupyter_relay_config.py``, which the server extension and the daemon both read) and ``--Class.trait=value`` on
the command line. Each command (``serve``, ``status``, ``grants`` ...) is a subcommand application,
:class:`RelayCommand`: the Jupyter options of its argv go to traitlets, the rest to the command's own argparse
parser (``relay_jupyter/cli/<module>.py``: ``register(subparsers)``), so every command keeps its flags.

Settings given as ``--RelayApp.<name>=value`` are the server extension's traits (``server/app.py``): the same
names, types and validation as ``c.RelayApp.<name>`` in a config file, and they win over the files for every
command that reads the broker settings (``server/jupyter_config.py``). A misspelt class or setting is refused
(traitlets would only warn, and a typo in a terminal command must not be silently dropped).

Why argparse stays under traitlets: the commands have positional arguments, nested actions (``grants add``) and
flags with their own spelling that traitlets' key-value parser cannot express; traitlets parses what it owns.

Every user mistake is one line ``jupyter relay: ...`` and exit 2 (``CommandLineError`` and ``RelayError``).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import Any, NoReturn

from jupyter_core.application import JupyterApp, NoStart, base_aliases, base_flags
from traitlets import Instance, TraitError, Unicode
from traitlets.config import Application, Config

from .. import __version__

__all__ = ["CommandLineError", "JupyterRelayApp", "OneLineParser", "RelayCommand", "split_argv"]


class CommandLineError(Exception):
    """A mistake on the command line: printed as one line, exit 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors: its own ``error`` prints the usage and the message on several lines."""

    def error(self, message: str) -> NoReturn:
        raise CommandLineError(f"{message} (see `{self.prog} --help`)")


#: ``--Class.trait=value`` / ``--Class.trait value``: a traitlets setting.
_TRAIT = re.compile(r"^--([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(=.*)?$", re.S)
#: traitlets' own flags of a subcommand (``-h``/``--help`` stay with argparse: the command's flags).
_FLAGS = frozenset({"--debug", "--show-config", "--show-config-json", "-y", "--y", "--help-all"})
_VALUED = frozenset({"--log-level"})


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(traitlets args, the command's own args)``. A valued option without ``=`` takes the next arg.

    Raises:
        CommandLineError: a valued Jupyter option at the end of the line.
    """
    jupyter: list[str] = []
    own: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            own += argv[i:]
            break
        match = _TRAIT.match(arg)
        name = arg.split("=", 1)[0]
        if match or name in _VALUED:
            if "=" not in arg:
                if i + 1 >= len(argv):
                    raise CommandLineError(f"{arg} needs a value ({arg}=VALUE)")
                arg = f"{arg}={argv[i + 1]}"
                i += 1
            jupyter.append(arg)
        elif arg in _FLAGS:
            jupyter.append(arg)
        else:
            own.append(arg)
        i += 1
    return jupyter, own


def _relay_app_class() -> type[Any]:
    # the extension's traits (one definition of every setting) in the c.RelayApp section, without importing the
    # extension itself (server/app.py: jupyter_server, seconds of every command line that names a setting)
    from ..server.settings import RelayApp

    return RelayApp


def _check_sections(config: Config, classes: list[type[Any]]) -> None:
    """Refuse a command-line setting of an unknown class or trait, and a value its trait refuses.

    Raises:
        CommandLineError: one line naming the option.
    """
    known = {cls.__name__: cls for cls in classes}
    for section, values in config.items():
        if not isinstance(values, (Config, dict)):  # a bare --name=value traitlets could not place
            raise CommandLineError(f"unknown option --{section}")
        cls = known.get(section)
        if cls is None:
            raise CommandLineError(f"unknown option --{section}.{next(iter(values), '')}: settings are "
                                   "--RelayApp.<name>=VALUE (see `jupyter relay --help-all`)")
        names = set(cls.class_trait_names(config=True))
        for name in values:
            if name not in names:
                raise CommandLineError(f"unknown setting --{section}.{name} (see `jupyter relay --help-all`)")
    if "RelayApp" in config:
        try:
            _relay_app_class()(config=config)
        except TraitError as exc:
            raise CommandLineError(f"--RelayApp: {str(exc).splitlines()[0][:300]}") from None


def _route_relay_logs(level: int) -> logging.Handler | None:
    """A command other than ``serve`` (which sets up the daemon's log files) prints relay's log lines on stderr at
    the app's level: warnings always, debug lines under ``--debug``."""
    top = logging.getLogger("relay_jupyter")
    if any(getattr(h, "_relay_cli", False) for h in top.handlers):
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[relay %(levelname)s %(name)s] %(message)s"))
    handler._relay_cli = True  # type: ignore[attr-defined]
    top.addHandler(handler)
    top.setLevel(level)
    return handler


class RelayCommand(JupyterApp):
    """One ``jupyter relay <command>``: traitlets parses the Jupyter options, the command's argparse parser the rest."""

    version = __version__
    command = Unicode("", help="the command's name (serve, grants, ...)")
    parser = Instance(argparse.ArgumentParser, allow_none=True)
    # no --config alias (serve, teams and tools have their own --config) and no --generate-config (top level only)
    aliases = {"log-level": "Application.log_level"}
    flags = {k: v for k, v in base_flags.items() if k not in ("generate-config",)}

    #: whether the settings' ``RelayApp`` (server/settings.py) is among the classes: it imports pydantic and the
    #: broker's config (it used to be the extension's class, which imports jupyter_server's ServerApp: 13 s against
    #: 35 s for ``status`` on a loaded 2-core machine), so only a command line that sets or lists its traits pays
    #: for it (``_wants_relay_app``)
    relay_app_listed = False

    @property
    def classes(self) -> list[type[Any]]:  # type: ignore[override]
        # the app's own class too: else traitlets "flattens" --debug / --generate-config (JupyterApp.*) onto
        # another class listed
        return [type(self), _relay_app_class()] if self.relay_app_listed else [type(self)]

    def _name(self) -> str:
        return f"jupyter relay {self.command}"

    def initialize(self, argv: list[str] | None = None) -> None:
        self.name = f"jupyter-relay-{self.command}"
        jupyter, own = split_argv(list(argv or []))
        self.own_argv = own
        self.relay_app_listed = _wants_relay_app(jupyter)
        self.parse_command_line(jupyter)

    def parse_command_line(self, argv: Any = None) -> None:
        try:
            _parse(self, argv)
        except TraitError as exc:
            raise CommandLineError(str(exc).splitlines()[0][:300]) from None
        if self.extra_args:
            raise CommandLineError(f"unexpected {self.extra_args[0]!r}")
        _check_sections(self.cli_config, list(self._classes_inc_parents()))

    def start(self) -> int:  # type: ignore[override]
        from ..server.jupyter_config import command_line_config

        if self.show_config or self.show_config_json:
            Application.start(self)  # prints the config the command line set
            return 0
        assert self.parser is not None
        args = self.parser.parse_args([self.command, *self.own_argv])
        # traitlets puts --debug under Application, or under this class when it is the only Application listed
        level_set = any("log_level" in self.cli_config.get(section, {}) for section in ("Application", type(self).__name__))
        # the daemon logs at INFO unless --debug / --log-level says otherwise; other commands print warnings
        args.log_level = self.log_level if level_set or self.command != "serve" else logging.INFO
        top = logging.getLogger("relay_jupyter")
        before = top.level
        handler = None if self.command == "serve" else _route_relay_logs(args.log_level)
        try:
            with command_line_config(self.cli_config):
                return int(args.func(args) or 0)
        finally:
            if handler is not None:
                top.removeHandler(handler)
                top.setLevel(before)


class JupyterRelayApp(JupyterApp):
    """``jupyter relay``: the terminal face of the broker."""

    name = "jupyter-relay"
    version = __version__
    description = ("relay-jupyter: serve the broker standalone (the daemon kernels outside Jupyter use), manage "
                   "grants, tokens, tool pins and teams, stop every run (kill).\n\n"
                   "Settings: c.RelayApp.<name> in jupyter_relay_config.py or jupyter_server_config.py (read by the "
                   "server extension and the daemon alike), or --RelayApp.<name>=VALUE after a command.")
    examples = ("jupyter relay serve --debug\n"
                "jupyter relay serve --RelayApp.openai_base_url=http://127.0.0.1:8080/v1\n"
                "jupyter relay grants add daemon:default --tools '*' --models '*'\n"
                "jupyter relay --generate-config")
    aliases = {k: v for k, v in base_aliases.items() if k != "config"}
    aliases["config"] = "JupyterApp.config_file"
    flags = dict(base_flags)
    parser = Instance(argparse.ArgumentParser, allow_none=True)

    #: whether the settings' ``RelayApp`` (server/settings.py) is among the classes: it imports pydantic and the
    #: broker's config (it used to be the extension's class, which imports jupyter_server's ServerApp: 13 s against
    #: 35 s for ``status`` on a loaded 2-core machine), so only a command line that sets or lists its traits pays
    #: for it (``_wants_relay_app``)
    relay_app_listed = False

    @property
    def classes(self) -> list[type[Any]]:  # type: ignore[override]
        # the app's own class too: else traitlets "flattens" --debug / --generate-config (JupyterApp.*) onto
        # another class listed
        return [type(self), _relay_app_class()] if self.relay_app_listed else [type(self)]

    def _config_file_name_default(self) -> str:
        return "jupyter_relay_config"

    def initialize(self, argv: list[str] | None = None) -> None:
        from . import build_parser

        self.parser = build_parser()
        sub = next(a for a in self.parser._actions if isinstance(a, argparse._SubParsersAction))
        helps = {action.dest: action.help or "" for action in sub._choices_actions}
        self.subcommands = {name: (self._factory(name), helps.get(name, "")) for name in sub.choices}
        argv = _command_first(list(argv or []), set(self.subcommands))
        self.relay_app_listed = _wants_relay_app(argv)
        try:
            _parse(self, argv)
        except TraitError as exc:
            raise CommandLineError(str(exc).splitlines()[0][:300]) from None
        if self.subapp is not None:
            return
        if self.extra_args:
            raise CommandLineError(f"unknown command {self.extra_args[0]!r} (commands: {', '.join(self.subcommands)})")
        _check_sections(self.cli_config, list(self._classes_inc_parents()))

    def _factory(self, name: str) -> Any:
        def make(parent: Application) -> RelayCommand:
            return RelayCommand(parent=parent, command=name, parser=self.parser)
        return make

    def load_config_file(self, *args: Any, **kwargs: Any) -> None:
        """The files the daemon and the extension read (``server/jupyter_config.py``), one line when one is broken."""
        from ..server.jupyter_config import load_jupyter_config

        config, _ = load_jupyter_config()
        self.update_config(config)
        self.update_config(self.cli_config)

    def start(self) -> int:  # type: ignore[override]
        if self.subapp is not None:
            return int(self.subapp.start() or 0)
        if self.generate_config:
            self.write_default_config()
            return 0
        if self.show_config or self.show_config_json:
            self.load_config_file()
            Application.start(self)
            return 0
        self.print_help()
        return 0


def _wants_relay_app(argv: list[str]) -> bool:
    return any(a.startswith(("--RelayApp.", "--help-all", "--generate-config", "--show-config")) for a in argv)


def _parse(app: Application, argv: list[str]) -> None:
    """traitlets' own parse, without its ``catch_config_error`` wrapper (that one logs CRITICAL and exits 1)."""
    parse = Application.parse_command_line
    getattr(parse, "__wrapped__", parse)(app, argv)


def _command_first(argv: list[str], commands: set[str]) -> list[str]:
    """``jupyter relay --debug serve ...`` -> ``serve --debug ...``: traitlets only sees a subcommand in front."""
    for i, arg in enumerate(argv):
        if arg in commands:
            return [arg, *argv[:i], *argv[i + 1:]] if all(a.startswith("-") for a in argv[:i]) else argv
        if not arg.startswith("-") or arg == "--":
            break
    return argv


def run(argv: list[str] | None = None) -> int:
    """Run ``jupyter relay`` with ``argv``; returns the exit status (never raises for a user mistake)."""
    from ..core.errors import RelayError

    app = JupyterRelayApp()
    try:
        app.initialize(sys.argv[1:] if argv is None else argv)
        return app.start()
    except (CommandLineError, RelayError) as exc:
        print(f"jupyter relay: {exc.message}", file=sys.stderr)
        return 2
    except NoStart:
        return 0
    except SystemExit as exc:  # --help, --version, argparse's --help
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        return 130
