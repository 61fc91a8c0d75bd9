"""What the ``llmperf`` subcommands share (argparse types).

Every other module of ``pytest_llmperf.cli`` is one subcommand: it defines ``HELP`` (one
line), ``add_arguments(parser)`` and ``run(args) -> int`` (exit status); ``cli.main`` finds them by listing the package, so a new command is one new
file. Keep imports of heavy modules inside ``run`` so ``llmperf --help`` stays fast.
"""

from typing import Any

from ..core.settings import alpha_arg as alpha  # noqa: F401  (the argparse types of every command; light)
from ..core.settings import share_arg as share  # noqa: F401


def positive_int(text: str) -> int:
    """An argparse type for counts that must be >= 1 (threads, runs)."""
    import argparse

    from ..core.settings_table import positive_int as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_setting(parser: Any, name: str) -> None:
    """The argument of a setting the command shares with the pytest plugin, from
    ``core.settings_table.SETTINGS``: its flag, parser, default and help, as pytest shows them."""
    import os

    from ..core.settings_table import SETTINGS

    s = SETTINGS[name]
    default = (os.environ.get(s.env) or s.default) if s.cli_env and s.env else s.default
    parser.add_argument(
        s.cli, type=s.arg_type(), default=default, metavar=s.metavar,
        help=s.help_text(sources=False).replace("%", "%%"),
    )
