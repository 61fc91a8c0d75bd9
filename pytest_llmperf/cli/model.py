"""``llmperf model [PRESET]``: write (once) a synthetic model and print its path."""

from __future__ import annotations

import argparse

from ..models.gguf import PRESETS, ensure_model

HELP = "write (once) and print the path of a synthetic model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", nargs="?", default="tiny", choices=sorted(PRESETS))


def run(args: argparse.Namespace) -> int:
    print(ensure_model(args.preset))
    return 0
