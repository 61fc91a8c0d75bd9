"""``llmperf`` command line: the subcommands live in the ``*_commands`` modules of this package
(shared helpers in ``common``).

Every command exits 0 on success, 1 when what it checked failed (e.g. a regression), 2 on
unusable input, printed as one ``llmperf: error:`` line, and 130 when stopped by Ctrl-C (one
line, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import shutil
import sys
import typing
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..core.errors import LLMPerfError
from ..core.progress import StreamSink, set_sink
from ..core.redact import redact
from ..core.settings import conflicting_option

#: The exit status after Ctrl-C (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130


#: A command: (help line, add its arguments, run it: the exit status).
Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _commands() -> dict[str, Command]:
    """Name -> (help line, add its arguments, run it) of every command, by name: each
    ``*_commands`` module of this package lists its own in ``COMMANDS``."""
    found: dict[str, Command] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.endswith("_commands"):
            found.update(importlib.import_module(f"{__name__}.{info.name}").COMMANDS)
    return dict(sorted(found.items()))


#: ``--help`` is at most this wide, whatever the terminal (a wider one reads worse, not better).
HELP_WIDTH = 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help at most ``HELP_WIDTH`` columns wide (argparse's own takes the terminal's
    width less 2, and a long metavar or choice list goes past it)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        width = min(width or shutil.get_terminal_size().columns - 2, HELP_WIDTH - 2)
        super().__init__(prog, indent_increment, max_help_position, width)


class Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported as one line (not the usage block) and exit 2;
    its help within ``HELP_WIDTH`` columns (``HelpFormatter``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one subparser per command."""
    parser = Parser(prog="llmperf", description="LLM inference performance tools")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for name, (help_line, add_arguments, _) in _commands().items():
        add_arguments(sub.add_parser(name, help=help_line, description=help_line))
    return parser


INTERRUPTED_LINE = "llmperf: interrupted (Ctrl-C) before the command finished; run it again to get its results"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its long waits say where they are on stderr (``core.progress``), so
    stdout holds its output alone."""
    before = set_sink(StreamSink(sys.stderr))
    try:
        found = _commands()
        args = build_parser().parse_args(argv)
        conflict = conflicting_option(sys.argv[1:] if argv is None else argv, cli=True)
        if conflict is not None:
            print(f"llmperf: warning: {conflict}", file=sys.stderr)
        return int(found[args.command][2](args))
    except LLMPerfError as exc:
        print(f"llmperf: error: {redact(str(exc))}", file=sys.stderr)  # no URL's password, whoever built the line
        return 2
    except KeyboardInterrupt as exc:  # the command's own cleanup (servers, engines) ran on the way out
        _quiet_teardown()
        print(f"llmperf: {exc}" if str(exc) else INTERRUPTED_LINE, file=sys.stderr)  # a wait's own line, if any
        return INTERRUPTED
    finally:
        set_sink(before)


def _quiet_teardown() -> None:
    """After Ctrl-C the process exits: what the interrupt cut short (an event loop half built,
    a coroutine never awaited) is collected without "Exception ignored" tracebacks or warnings
    after the one line."""
    sys.unraisablehook = lambda unraisable: None
    warnings.simplefilter("ignore")
