"""``llmperf`` command line: one subcommand per module in ``pytest_llmperf.commands``.

Every command exits 0 on success, 1 when what it checked failed (e.g. a regression) and 2 on
unusable input, printed as one ``llmperf: error:`` line.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Sequence

from . import commands
from .errors import LLMPerfError


def _commands() -> dict[str, object]:
    found = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            found[info.name] = importlib.import_module(f"{commands.__name__}.{info.name}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmperf", description="LLM inference performance tools")
    sub = parser.add_subparsers(dest="command", required=True)
    found = _commands()
    for name, module in found.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))  # type: ignore[attr-defined]
    args = parser.parse_args(argv)
    try:
        return int(found[args.command].run(args))  # type: ignore[attr-defined]
    except LLMPerfError as exc:
        print(f"llmperf: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
