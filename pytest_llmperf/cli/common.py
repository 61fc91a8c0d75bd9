"""What the ``llmperf`` subcommands share (argparse types).

Each ``*_commands`` module of ``pytest_llmperf.cli`` holds subcommands: for each one a help
line, ``add_<name>_arguments(parser)`` and ``run_<name>(args) -> int`` (exit status), listed
in its ``COMMANDS``; ``cli.main`` finds those modules by listing the package, so a new command
is three definitions and one entry. Keep imports of heavy modules inside ``run_<name>`` so
``llmperf --help`` stays fast.
"""

import argparse
import os

from ..core import settings
from ..core.documents import check_output, check_output_folder, refused_output
from ..core.documents import write_output as write
from ..core.errors import ConfigError
from ..core.settings import RENAMED_SETTINGS, SETTINGS, model_text, renamed_line
from ..core.settings import alpha_arg as alpha  # noqa: F401  (the argparse types of every command; light)
from ..core.settings import share_arg as share  # noqa: F401
from ..core.settings import share_of_one_arg as share_of_one  # noqa: F401
from ..core.values import arg_type


def check_writable(path: str, flag: str, *, folder: bool = False) -> None:
    """Fail now, in one line, when ``path`` (``folder``: a folder of outputs) cannot be
    written (``core.documents.check_output``), before the work that fills it."""
    try:
        (check_output_folder if folder else check_output)(path)
    except OSError as exc:
        raise ConfigError(refused_output(path, exc, flag)) from None


#: argparse types (``core.values.arg_type``) of an output file's path, a saved session report's, a
#: GGUF path or preset and a folder of outputs: never empty (a session report's would read ".").
output_file = arg_type(settings.output_file)
session_report = arg_type(settings.not_empty("is empty; give the path of a session report (pytest --llmperf-json)"))
model = arg_type(model_text)
output_folder = arg_type(settings.not_empty("is empty; give a folder (made when missing)"))


def write_output(path: str, text: str) -> str:
    """``text`` to the output ``path`` (``core.documents.write_output``: a file atomically, a
    device or FIFO in place, ``-`` to standard output); a failed write is one line
    (ConfigError). Returns the kind written ("stdout", "in place", "file")."""
    try:
        return write(path, text)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None


#: An argparse type for counts that must be >= 1 (threads, runs).
positive_int = arg_type(settings.positive_int)


def add_setting(parser: argparse._ActionsContainer, name: str) -> None:
    """The argument of a setting the command shares with the pytest plugin, from
    ``core.settings.SETTINGS``: its flag, parser, default and help, as pytest shows them."""
    s = SETTINGS[name]
    if s.cli is None:
        raise ValueError(f"setting {name!r} has no llmperf flag")
    default = (os.environ.get(s.env) or s.default) if s.cli_env and s.env else s.default
    parser.add_argument(
        s.cli, type=s.arg_type(), default=default, metavar=s.metavar, help=s.help_text(sources=False).replace("%", "%%")
    )
    add_renamed(parser, name)


def add_renamed(parser: argparse._ActionsContainer, name: str) -> None:
    """The setting's old flag (``core.settings.RENAMED``), hidden: using it is one line that
    names the new flag (``llmperf profile: error: option '--n-gpu-layers' was renamed to
    '--gpu-layers'``), exit 2."""

    class Refuse(argparse.Action):
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: object,
            option_string: str | None = None,
        ) -> None:
            parser.error(renamed_line("option", self.option_strings[0], str(self.const)))  # const: the new flag

    for old, new in RENAMED_SETTINGS:
        if new.name == name and old.cli is not None and new.cli is not None:
            parser.add_argument(
                old.cli, action=Refuse, const=new.cli, nargs="?", dest=argparse.SUPPRESS, help=argparse.SUPPRESS
            )
