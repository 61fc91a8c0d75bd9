"""Subcommands of the ``llmperf`` console script, one module each.

A module here defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``
(exit status); ``cli.main`` finds them by listing this package, so a new command is one new
file. Keep imports of heavy modules inside ``run`` so ``llmperf --help`` stays fast.
"""
