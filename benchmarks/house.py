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
function is given (its parameters' values) or returns (a dict or a ``pytest_llmperf``
dataclass) is kept, and after the session the ones that hold the test's workload (a field
``max_tokens`` equal to the marker's, theirs or one field deep), a run's raw clock readings (a
field of one nanosecond reading per generated token) or its measured TTFT (the
``Measurement``'s median or a run's, exact or rounded by ``sig6``; one to three fields deep)
are grouped by their type (a ``pytest_llmperf`` class, or a dict by its keys). ``--list`` prints them in the order they first appeared, each with
the function that first returned it (or was given it).

Rules, each read from the code, none a list of shapes kept by hand:

- A shape's *parts* count with it, not as shapes of their own: the dataclass types its class
  declares as its fields' types (inside ``X | None``, ``tuple[X, ...]``...) that are defined in
  the same module as the class, and their parts in turn (``RunMetrics`` in
  ``Measurement.runs``, ``BaselineVerdict`` in ``Outcome.verdict``: a record's own pieces live
  beside it). A type from another module is a shape the record holds, not a piece of it (the
  ``Workload`` in ``Measurement.workload`` is what was measured, a shape before it on the line).
- A record's *stored form* is its own while it only travels as JSON: a dict a ``to_json`` /
  ``as_dict`` wrote that ``json.dumps`` makes text (a request on a worker's pipe), or one
  ``json.loads`` parsed that a ``from_json`` reads (a run's trace back from the worker), no
  package function given it on the way (a function's arguments are looked at, not what a tuple
  or list holds). Everything seen inside a ``to_json`` / ``from_json`` is its writing and
  reading. A dict that holds the workload or a TTFT built outside them, or a stored form some
  function is given and reads (a record read as a dict), still counts.
- The marker's keywords (``MARKER``, the dict the test's ``@pytest.mark.llmperf(...)`` is
  written from; the plugin merges the levels' ``Mark.kwargs`` into one such dict) are the
  user's input, where the line starts: a dict of them, or of some of them with the values the
  test gave (``MarkerConfig``'s field of their kind), is not a shape.
- What ``reports/`` functions see, and the classes ``reports/`` defines, are left out: a
  report's own view is the report's business.
- A list, dict or set comprehension is an expression of the function that holds it, not a
  function (Python 3.12 runs it inline, PEP 709; 3.10 and 3.11 give it a frame of its own): what
  it builds is seen where that function gives or returns it (its steps still count).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import os
import statistics
import sys
import tempfile
import threading
from collections import Counter
from importlib import metadata
from itertools import pairwise
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path and "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(ROOT))

import pytest

import pytest_llmperf

PACKAGE = Path(pytest_llmperf.__file__).resolve().parent

#: The marker-only test's keywords: the user's input, where a measurement's line starts.
MARKER: dict[str, object] = {"prompt_tokens": 16, "max_tokens": 8, "runs": 3, "warmup": 1}

TEST = f"""
import pytest


@pytest.mark.llmperf({", ".join(f"{k}={v!r}" for k, v in MARKER.items())})
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
MAX_TOKENS = MARKER["max_tokens"]
#: Functions that write or read a record's own stored form: what they return or are given, and
#: what is seen inside them, is that form, not a shape on the main line.
STORED_FORMS = frozenset({"to_json", "as_dict", "_as_json", "to_dict", "from_json"})
#: The frames of comprehensions before Python 3.12 (the docstring's rule: not functions).
COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>"})


@dataclasses.dataclass
class Seen:
    """An object a package function returned, with the data objects it was given."""

    where: str
    value: object
    inputs: list[object]


@dataclasses.dataclass
class Traced:
    """What one traced session saw: the package's steps (their files), every package function's
    data (``Seen``), and the stored forms' ends: the dicts a ``to_json`` & co. returned
    (``written``) and ``json.dumps`` was given (``dumped``), those ``json.loads`` returned
    (``parsed``) and a ``from_json`` was given (``read``)."""

    steps: list[str] = dataclasses.field(default_factory=list)
    seen: list[Seen] = dataclasses.field(default_factory=list)
    _given: dict[int, list[object]] = dataclasses.field(default_factory=dict)  # by frame, until it returns
    _depth: dict[int, int] = dataclasses.field(default_factory=dict)  # per thread: STORED_FORMS calls under way
    written: list[object] = dataclasses.field(default_factory=list)
    dumped: list[object] = dataclasses.field(default_factory=list)
    parsed: list[object] = dataclasses.field(default_factory=list)
    read: list[object] = dataclasses.field(default_factory=list)

    def stored(self) -> set[int]:
        """Ids of the stored forms that only travel (the docstring's rule): written by a to_json
        and made JSON text, or parsed from JSON text and read by a from_json, and no package
        function given them on the way."""
        given = {id(v) for s in self.seen for v in s.inputs}
        dumped, parsed = {id(v) for v in self.dumped}, {id(v) for v in self.parsed}
        ends = {id(v) for v in self.written if id(v) in dumped} | {id(v) for v in self.read if id(v) in parsed}
        return ends - given

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        """``sys.setprofile``'s hook: a package function's call and return, ``json``'s ends."""
        name = frame.f_code.co_filename
        if name == JSON_FILE and event == "call" and frame.f_code.co_name == "dumps":
            self.dumped.append(frame.f_locals.get("obj"))
        elif name == JSON_FILE and event == "return" and frame.f_code.co_name == "loads":
            self.parsed.append(arg)
        elif name.startswith(PREFIX) and event == "call":
            self.steps.append(name)
            stored_form = frame.f_code.co_name in STORED_FORMS
            thread = threading.get_ident()
            self._depth[thread] = self._depth.get(thread, 0) + stored_form
            if self._depth[thread] == stored_form and frame.f_code.co_name not in COMPREHENSIONS:
                # outside a stored form, or the outermost one
                self._given[id(frame)] = [v for v in arguments(frame) if is_shape_candidate(v)]
        elif name.startswith(PREFIX) and event == "return":
            self._returned(frame, arg)

    def _returned(self, frame: FrameType, arg: object) -> None:
        stored_form = frame.f_code.co_name in STORED_FORMS
        thread = threading.get_ident()
        self._depth[thread] = self._depth.get(thread, 0) - stored_form
        inputs = self._given.pop(id(frame), None)
        if inputs is None:
            return
        if frame.f_code.co_name == "from_json":
            self.read += inputs
        elif stored_form:
            self.written.append(arg)
        else:
            value = arg if is_shape_candidate(arg) else None
            self.seen.append(Seen(f"{module_of(frame.f_code.co_filename)}.{frame.f_code.co_name}", value, inputs))


def arguments(frame: FrameType) -> list[object]:
    """What a function was given: its parameters' values (``*args`` as one tuple, ``**kwargs``
    as one dict), not its other locals (a generator resumed has bound some)."""
    code = frame.f_code
    varargs = bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount + varargs]
    return [frame.f_locals[n] for n in names if n in frame.f_locals]


#: Where ``json.dumps`` and ``json.loads`` are defined (their calls are traced too).
JSON_FILE = json.__file__
#: A package function's file starts so.
PREFIX = str(PACKAGE) + os.sep


def run_test(folder: Path, trace: bool) -> tuple[int, Traced]:
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
    traced = Traced()
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        if trace:
            threading.setprofile(traced.profile)
            sys.setprofile(traced.profile)
        try:
            code = pytest.main(args)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    finally:
        os.chdir(cwd)
    return int(code), traced


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


def parts_of(cls: type, found: set[type] | None = None) -> set[type]:
    """The dataclass types ``cls`` declares as its fields' types that are defined in its own
    module, and their parts in turn (the docstring's rule)."""
    found = set() if found is None else found
    module = sys.modules[cls.__module__]
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        for node in ast.walk(ast.parse(text, mode="eval")):
            kind = getattr(module, node.id, None) if isinstance(node, ast.Name) else None
            if (
                isinstance(kind, type)
                and dataclasses.is_dataclass(kind)
                and kind.__module__ == cls.__module__
                and kind is not cls
                and kind not in found
            ):
                found.add(kind)
                parts_of(kind, found)
    return found


def is_marker(value: object) -> bool:
    """The marker's keywords, or some of them (a ``MarkerConfig`` field): what the test wrote."""
    return isinstance(value, dict) and value.items() <= MARKER.items()


#: A class defined here is a report's own view of the results.
REPORTS = "pytest_llmperf.reports"


def shapes(traced: Traced) -> dict[str, tuple[str, list[str]]]:
    """{shape: (the function that first returned it or was given it, the parts seen with it)},
    in the order they appeared."""
    returned = traced.seen
    ttfts = measured_ttfts(returned)
    stored = traced.stored()
    found: dict[str, str] = {}
    kinds: dict[str, type] = {}
    for seen in returned:
        for value in [*seen.inputs, seen.value]:
            if value is None or is_marker(value) or id(value) in stored or type(value).__module__.startswith(REPORTS):
                continue
            if (
                layer_of(seen.where.rsplit(".", 1)[0]) != "reports"
                and shape_key(value) not in found
                and carries(value, ttfts)
            ):
                found[shape_key(value)] = seen.where
                if not isinstance(value, dict):
                    kinds[shape_key(value)] = type(value)
    parts = {key: parts_of(kind) for key, kind in kinds.items()}
    whole = {part: key for key, of in parts.items() for part in of}
    return {
        key: (where, [k.rsplit(".", 1)[1] for k, kind in kinds.items() if whole.get(kind) == key])
        for key, where in found.items()
        if key not in kinds or kinds[key] not in whole
    }


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
        code, traced = run_test(folder, trace=True)
    steps = traced.steps
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
    found = shapes(traced)
    print(f"shapes of one measurement, marker to report (reports' own views left out): {len(found)}")
    if args.list:
        for key, (where, parts) in found.items():
            print(f"  {key}  (first from {where}{'; with its parts ' + ', '.join(parts) if parts else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
