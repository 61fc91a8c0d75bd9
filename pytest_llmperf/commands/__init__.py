"""Subcommands of the ``llmperf`` console script, one module each.

A module here defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``
(exit status); ``cli.main`` finds them by listing this package, so a new command is one new
file. Keep imports of heavy modules inside ``run`` so ``llmperf --help`` stays fast.
"""


def share(text: str) -> float:
    """An argparse type for thresholds: ``5%`` or ``0.05``, as the pytest options take them."""
    import argparse

    from ..settings import parse_fraction

    try:
        return parse_fraction(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def alpha(text: str) -> float:
    """An argparse type for a significance level in (0, 1): ``1%`` or ``0.01``."""
    import argparse

    from ..settings import parse_fraction

    try:
        return parse_fraction(text, high=1.0)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
