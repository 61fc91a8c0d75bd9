"""``llmperf`` command line. Subcommands arrive with later features; ``model`` is here now."""

from __future__ import annotations

import argparse
import sys

from .synthetic import PRESETS, ensure_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmperf", description="LLM inference performance tools")
    sub = parser.add_subparsers(dest="command", required=True)
    model = sub.add_parser("model", help="write (once) and print the path of a synthetic model")
    model.add_argument("preset", nargs="?", default="tiny", choices=sorted(PRESETS))
    args = parser.parse_args(argv)
    if args.command == "model":
        print(ensure_model(args.preset))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
