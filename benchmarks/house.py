"""The package's shape as a newcomer meets it (issue 24): how many modules, how long, and how
many of them one marker-only test runs through.

    python benchmarks/house.py [--list] [--static]

Prints the module count and median length (lines, ``__init__.py`` files included) of the
``pytest_llmperf`` that is imported (the checkout's own when run from it, or whatever
PYTHONPATH puts first), its annotations (each parameter's, each return's, each annotated
assignment or dataclass field, read with ``ast``) and how many of them name ``Any`` anywhere
inside (``dict[str, Any]`` counts; a string annotation is read too), then (not with
``--static``) traces one in-process ``pytest.main`` of a marker-only test
(``@pytest.mark.llmperf(...)`` over an empty body, model ``tiny``, history off) in a temporary
folder with ``sys.setprofile``: every call into a ``pytest_llmperf`` frame is one step, a step in
another file than the step before is a file switch, in another layer (``core``, ``judge``...,
the package root counted as its own) a layer switch. The engine worker's child process (where
llama.cpp runs) is not traced; the pytest session around it is. One untraced run goes first, so
the model is written and the caches are warm for the traced one. ``--list`` also prints the
modules the test ran, with their step counts.

The same trace counts the *shapes* one measurement takes on its way from the marker to the
report, read from the code as it runs, not from a list: every object a ``pytest_llmperf``
function is given or returns (a dict or a ``pytest_llmperf`` dataclass) is kept, and after the
session the ones that hold the test's workload (a field ``max_tokens`` equal to the
marker's, theirs or one field deep), a run's raw clock readings (a field of one nanosecond
reading per generated token) or its measured TTFT (the ``Measurement``'s median or a run's, exact or rounded
by ``sig6``; one to three fields deep) are grouped by their type (a ``pytest_llmperf`` class,
or a dict by its keys). Left out: what ``reports/`` functions see (a report's own view is the
report's business) and what a ``to_json`` / ``as_dict`` returns (the record's own stored form). ``--list`` prints them in the order they first appeared, each with
the function that first returned it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
from collections import Counter
from importlib import metadata
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path and "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(ROOT))

import pytest

import pytest_llmperf

PACKAGE = Path(pytest_llmperf.__file__).resolve().parent

TEST = """
import pytest


@pytest.mark.llmperf(prompt_tokens=16, max_tokens=8, runs=3, warmup=1)
def test_marker_only():
    pass
"""


def shape() -> tuple[int, float, int]:
    """(modules, median lines, modules of 50 lines or fewer)."""
    sizes = [len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")]
    return len(sizes), statistics.median(sizes), sum(1 for n in sizes if n <= 50)


def annotations(tree: ast.AST) -> list[ast.expr]:
    """Every annotation of a module: parameters (``*args``, ``**kwargs`` too), returns, annotated
    assignments (dataclass fields, class and module attributes, locals)."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
            found += [p.annotation for p in params if p is not None and p.annotation is not None]
            found += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return found


def names_any(annotation: ast.expr) -> bool:
    """``Any`` (or ``typing.Any``) anywhere in the annotation, strings parsed as annotations."""
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Any" or isinstance(node, ast.Attribute) and node.attr == "Any":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                if names_any(ast.parse(node.value, mode="eval").body):
                    return True
            except SyntaxError:
                continue
    return False


def any_count() -> tuple[int, int]:
    """(annotations, those that name ``Any``) over the package."""
    found = [a for p in PACKAGE.rglob("*.py") for a in annotations(ast.parse(p.read_text()))]
    return len(found), sum(names_any(a) for a in found)


def module_of(filename: str) -> str:
    rel = Path(filename).resolve().relative_to(PACKAGE).with_suffix("")
    parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
    return ".".join(("pytest_llmperf", *parts))


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(package root)"


#: The marker's ``max_tokens`` (TEST): the value a workload-carrying shape holds.
MAX_TOKENS = 8
#: Functions whose return is a record's own stored form, not a shape on the main line.
STORED_FORMS = frozenset({"to_json", "as_dict", "_as_json", "to_dict"})


@dataclasses.dataclass
class Seen:
    """An object a package function returned, with the data objects it was given."""

    where: str
    value: object
    inputs: list[object]


def run_test(folder: Path, trace: bool) -> tuple[int, list[str], list[Seen]]:
    installed = any(ep.name == "llmperf" for ep in metadata.entry_points(group="pytest11"))
    args = [
        str(folder / "test_marker_only.py"),
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:warnings",
        "--rootdir",
        str(folder),
        "--llmperf-history",
        "off",
        "--llmperf-threads",
        "1",
    ]
    if not installed:
        args += ["-p", "pytest_llmperf.pytest_plugin.plugin"]
    steps: list[str] = []
    returned: list[Seen] = []
    given: dict[int, list[object]] = {}
    prefix = str(PACKAGE) + os.sep

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if not name.startswith(prefix):
            return
        if event == "call":
            steps.append(name)
            given[id(frame)] = [v for v in frame.f_locals.values() if is_shape_candidate(v)]
        elif event == "return":
            inputs = given.pop(id(frame), [])
            if is_shape_candidate(arg):
                returned.append(Seen(f"{module_of(name)}.{frame.f_code.co_name}", arg, inputs))

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        if trace:
            threading.setprofile(profile)
            sys.setprofile(profile)
        try:
            code = pytest.main(args)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    finally:
        os.chdir(cwd)
    return int(code), steps, returned


def is_shape_candidate(value: object) -> bool:
    """Data: a dict, or a ``pytest_llmperf`` dataclass (not a long-lived object that holds
    results, like the session or a fixture)."""
    return isinstance(value, dict) or is_package_object(value) and dataclasses.is_dataclass(value)


def is_package_object(value: object) -> bool:
    return type(value).__module__.startswith("pytest_llmperf.") and not isinstance(value, type)


def fields_of(value: object) -> list[tuple[str, object]]:
    """(name, value) of an object's fields: a dict's items, a dataclass's or a plain object's
    attributes (properties are not run)."""
    if isinstance(value, dict):
        return [(str(k), v) for k, v in value.items()]
    if dataclasses.is_dataclass(value):
        return [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    return list(getattr(value, "__dict__", {}).items())


def carries(value: object, ttfts: set[float], depth: int = 3) -> bool:
    """Whether ``value`` holds the workload (``max_tokens``, at most one field deep) or a
    measured TTFT (at most ``depth`` fields deep; lists and tuples looked into)."""
    for name, item in fields_of(value):
        if name == "max_tokens" and item == MAX_TOKENS and depth >= 2:
            return True
        if depth == 3 and is_token_clock(item):
            return True
        if isinstance(item, float) and item in ttfts:
            return True
        items = item if isinstance(item, (list, tuple)) else [item]
        for x in items[:8]:
            if depth > 1 and (isinstance(x, dict) or is_package_object(x)) and carries(x, ttfts, depth - 1):
                return True
    return False


def is_token_clock(item: object) -> bool:
    """A run's raw clock readings, one per generated token (what a TTFT is computed from)."""
    return (
        isinstance(item, (list, tuple))
        and len(item) == MAX_TOKENS
        and all(isinstance(x, int) and x > 10**9 for x in item)
    )


def shape_key(value: object) -> str:
    if isinstance(value, dict):
        keys = sorted(map(str, value))
        return "dict{" + ", ".join(keys[:5]) + (", ..." if len(keys) > 5 else "") + "}"
    return f"{type(value).__module__}.{type(value).__qualname__}"


def measured_ttfts(returned: list[Seen]) -> set[float]:
    """The Measurement's TTFT median and each run's, exact and as stored (sig6)."""
    from pytest_llmperf.core.formats import sig6

    values: set[float] = set()
    for value in (seen.value for seen in returned):
        if type(value).__name__ == "Measurement":
            ttft = getattr(value, "ttft_ms", None)
            runs = [getattr(r, "ttft_ms", None) for r in getattr(value, "runs", ())]
            values |= {v for v in (ttft, *runs) if isinstance(v, float)}
    return values | {sig6(v) for v in values}


def shapes(returned: list[Seen]) -> dict[str, str]:
    """{shape: the function that first returned it (or was given it)}, in the order they
    appeared."""
    ttfts = measured_ttfts(returned)
    found: dict[str, str] = {}
    for seen in returned:
        for value in [*seen.inputs, seen.value]:
            function = seen.where.rsplit(".", 1)
            if layer_of(function[0]) == "reports" or function[1] in STORED_FORMS:
                continue
            if shape_key(value) not in found and carries(value, ttfts):
                found[shape_key(value)] = seen.where
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="also print the modules the test ran")
    ap.add_argument("--static", action="store_true", help="only the counts read from the source (no test run)")
    args = ap.parse_args()
    count, median, small = shape()
    total, with_any = any_count()
    print(f"package: {PACKAGE}")
    print(f"modules: {count}, median {median:g} lines, {small} of 50 lines or fewer")
    print(f"annotations: {total}, {with_any} of them with Any ({with_any / total:.1%})")
    if args.static:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_marker_only.py").write_text(TEST)
        run_test(folder, trace=False)
        code, steps, returned = run_test(folder, trace=True)
    if code != 0:
        print(f"the marker-only test's session exited {code}", file=sys.stderr)
        return 1
    modules = [module_of(s) for s in steps]
    files = sum(1 for a, b in pairwise(steps) if a != b)
    layers = sum(1 for a, b in pairwise(modules) if layer_of(a) != layer_of(b))
    ran = Counter(modules)
    print(
        f"one marker-only test (in process): {len(ran)} modules, {len(steps)} calls, "
        f"{files} file switches, {layers} layer switches"
    )
    if args.list:
        for name, n in sorted(ran.items()):
            print(f"  {n:6d}  {name}")
    found = shapes(returned)
    print(f"shapes of one measurement, marker to report (reports' own views left out): {len(found)}")
    if args.list:
        for key, where in found.items():
            print(f"  {key}  (first from {where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
