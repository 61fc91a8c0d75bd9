"""``llmperf server build``: llama.cpp's llama-server (and llama-bench) of the installed
llama-cpp-python's version, built once per version into the user cache."""

from __future__ import annotations

import argparse

HELP = "build llama.cpp's llama-server and llama-bench for the installed llama-cpp-python"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser(
        "build",
        help="build (or find cached) llama-server and llama-bench; prints their paths",
        description="Builds llama-server and llama-bench from the llama.cpp sources in the installed "
        "llama-cpp-python's sdist (cmake and a C++ compiler needed; several minutes, once per version).",
    )


def run(args: argparse.Namespace) -> int:
    from ..engines.servers import build_tools

    tools = build_tools(progress=print)
    for name, path in tools.paths.items():
        print(f"{name}: {path}")
    if tools.build_s is None:
        print(f"llmperf: llama.cpp tools of llama-cpp-python {tools.version} were cached (log: {tools.log})")
    else:
        print(f"llmperf: built for llama-cpp-python {tools.version} in {tools.build_s:.0f} s (log: {tools.log})")
    return 0
