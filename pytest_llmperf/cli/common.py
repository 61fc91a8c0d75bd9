"""What the ``llmperf`` subcommands share (argparse types).

Every other module of ``pytest_llmperf.cli`` is one subcommand: it defines ``HELP`` (one
line), ``add_arguments(parser)`` and ``run(args) -> int`` (exit status); ``cli.main`` finds them by listing the package, so a new command is one new
file. Keep imports of heavy modules inside ``run`` so ``llmperf --help`` stays fast.
"""

from ..core.settings import alpha_arg as alpha  # noqa: F401  (the argparse types of every command; light)
from ..core.settings import share_arg as share  # noqa: F401


def positive_int(text: str) -> int:
    """An argparse type for counts that must be >= 1 (threads, runs)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
