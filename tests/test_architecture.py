"""The package's shape, as docs/architecture.md draws it: packages named after the layers,
each importing only from its own layer or the layers below, no import circle (lazy imports
inside functions and imports under ``if TYPE_CHECKING:`` count for both), pytest imported only
by the pytest layer, no private name imported from another module. The length of a module is
not capped: ruff's complexity rule (C901) caps each function instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_llmperf"

#: Bottom to top. The pytest plugin and the CLI are both on top and never import each other.
LAYERS = [
    "core",
    "models",
    "engines",
    "measuring",
    "baselines",
    "judge",
    "history",
    "reports",
    "session",
    "pytest_plugin|cli",
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names.split("|")}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every pytest_llmperf module (and 'pytest') this module imports, at any depth of the
    code: inside functions and under ``if TYPE_CHECKING:`` too (an import for type checkers
    is still a dependency, and a circle it closes is still a circle). The one exception is the
    package root's ``TYPE_CHECKING`` block: it is the public API's list, which the root's
    ``__getattr__`` reads, each name imported on a user's first use of it, never by a layer."""
    tree = ast.parse(path.read_text())
    skip = {
        id(n)
        for node in ast.walk(tree)
        if name == "pytest_llmperf" and isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) not in skip:
            found |= _named(name, path, node)
    return found


def _named(name: str, path: Path, node: ast.AST) -> set[str]:
    """The modules one statement imports: a pytest_llmperf module by its full name (a
    submodule when the names imported are submodules), any other by the name it is imported by;
    nothing when the statement is no import."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    subs = {f"{module}.{a.name}" for a in node.names} & set(MODULES)
    return subs if len(subs) == len(node.names) else subs | {module}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # the package root (its lazy exports) is no layer


def test_every_module_is_in_a_layer():
    assert {_layer(m) for m in MODULES} - {None} - {"schemas"} <= set(RANK)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_only_from_its_layer_or_below(name):
    own = _layer(name)
    if own is None:
        return
    upward = sorted(
        t
        for t in GRAPH[name]
        if t.startswith("pytest_llmperf.") and _layer(t) in RANK and _layer(t) != own and RANK[_layer(t)] >= RANK[own]
    )
    assert not upward, f"{name} ({own}) imports from a layer above or beside it: {upward}"


def test_no_import_circles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v] & set(MODULES):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert circles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_pytest_only_in_the_pytest_layer():
    users = sorted(m for m, found in GRAPH.items() if {"pytest", "_pytest"} & {f.split(".")[0] for f in found})
    assert users and all(_layer(m) == "pytest_plugin" for m in users), users


def test_no_public_name_is_shadowed_by_a_subpackage():
    """``from pytest_llmperf import measure`` must stay the function: a subpackage of the same
    name would replace it on the package once anything imported the subpackage."""
    import pytest_llmperf

    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert not packages & set(pytest_llmperf.__all__)


def test_no_private_name_is_imported_from_another_module():
    """A leading underscore means "this module's own": another module that needs it needs a
    public name (tests/test_engine.py checks that no module reads an engine's private attributes)."""
    reached = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("pytest_llmperf")):
                reached += [
                    f"{name}: {a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert reached == []


def test_a_layer_takes_only_the_version_from_the_package_root():
    """The package root is no layer: it names the public API (each name imported from its
    layer on first use, none at import time) and writes ``__version__``, the one thing a layer
    may import from it (the fingerprint and the history record it)."""
    assert not {m for m in GRAPH["pytest_llmperf"] if m.startswith("pytest_llmperf")}
    taken = []
    for name, path in MODULES.items():
        if _layer(name) is None:
            continue
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                if module == "pytest_llmperf":
                    taken += [f"{name}: {a.name}" for a in node.names if a.name != "__version__"]
            elif isinstance(node, ast.Import):
                taken += [f"{name}: import {a.name}" for a in node.names if a.name == "pytest_llmperf"]
    assert taken == []


#: The clocks of ``time``: a measurement's clock reads live in ``measuring/`` (its loops) and
#: ``engines/`` (an engine's run reads the clock inside its own loop), nowhere else.
CLOCKS = {
    f"{clock}{ns}"
    for clock in ("perf_counter", "monotonic", "time", "process_time", "thread_time")
    for ns in ("", "_ns")
}
TIMED_LAYERS = {"measuring", "engines"}

#: The modules elsewhere that read a clock, each with why that is no measurement.
NOT_MEASUREMENTS = {
    "pytest_llmperf.core.progress": "how long a wait has lasted, for its progress line (silent inside a run)",
    "pytest_llmperf.history.connection": "deadlines on the history database's locks and connections",
    "pytest_llmperf.session.against": "the controller's time cap on a test's pairs and the seconds its note says",
    "pytest_llmperf.session.refs": "a deadline on the lock of the cached worktrees",
    "pytest_llmperf.session.results": "the time cap on a test's sequential looks",
    "pytest_llmperf.session.sides": "deadlines on a side's start and its replies",
}


def _clock_reads(source: str) -> list[int]:
    """The lines that name a clock of ``time`` (called or handed on: ``time.monotonic()``,
    ``clock=time.perf_counter``, ``from time import perf_counter_ns``), whatever ``time`` is
    imported as."""
    tree = ast.parse(source)
    names = {
        a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.name == "time"
    }
    imported = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "time" and {a.name for a in n.names} & CLOCKS
    ]
    named = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr in CLOCKS and ast.unparse(n.value) in names
    ]
    return sorted(imported + named)


def test_the_clock_scan_sees_each_way_of_reading_a_clock():
    assert _clock_reads("import time\nt0 = time.perf_counter_ns()\n") == [2]
    assert _clock_reads("import time as t\ndef f(clock=t.monotonic):\n    return clock()\n") == [2]
    assert _clock_reads("from time import perf_counter\nx = perf_counter()\n") == [1]
    assert _clock_reads("import time\ntime.sleep(1)\nstarted = datetime.now()\n") == []


def test_only_measuring_and_engines_read_a_clock_around_a_run():
    """One home for every clock read of a measurement (the runner, the interleaved pairs, a
    side's runs, the stepped runs): another module's clock reads are deadlines, caps or
    progress, each listed with its reason."""
    reading = {
        name: lines
        for name, path in MODULES.items()
        if _layer(name) not in TIMED_LAYERS and (lines := _clock_reads(path.read_text()))
    }
    unlisted = {name: lines for name, lines in reading.items() if name not in NOT_MEASUREMENTS}
    assert unlisted == {}, "a clock read outside measuring/ and engines/: move the timed loop there"
    assert sorted(reading) == sorted(NOT_MEASUREMENTS), "a listed module no longer reads a clock: drop it"


def _every_import(name: str, source: str, *, package: bool = False) -> set[str]:
    """Every module that module ``name`` (a package's ``__init__``: ``package``) imports: for
    type checkers, inside functions, anywhere."""
    here = name if package else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {module, *(f"{module}.{a.name}" for a in node.names)}
    return found


def test_the_import_scan_sees_imports_for_type_checkers_and_in_functions():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..pytest_plugin.side import Link\n"
        "def f():\n    from .. import pytest_plugin\n"
    )
    found = _every_import("pytest_llmperf.session.x", source)
    assert {"pytest_llmperf.pytest_plugin.side", "pytest_llmperf.pytest_plugin"} <= found


def test_the_session_never_imports_the_pytest_plugin():
    """``session/`` is the pytest-free session: not even a type comes from ``pytest_plugin``
    (a side's ``Link`` is ``session.sides``'), so no import circle runs through the two."""
    plugin = "pytest_llmperf.pytest_plugin"
    reached = {
        name: sorted(
            m
            for m in _every_import(name, path.read_text(), package=path.name == "__init__.py")
            if m == plugin or m.startswith(plugin + ".")
        )
        for name, path in MODULES.items()
        if _layer(name) == "session"
    }
    assert {name: found for name, found in reached.items() if found} == {}


# -- imports inside functions ------------------------------------------------------------------

#: What a function may import inside itself, and why: a heavy dependency (``python -X importtime``,
#: cumulative, on the CI machine), an optional or platform-bound one, or a module of the
#: package that imports a heavy one at its top. Every other import sits at the top of its
#: module. docs/architecture.md ("Imports inside functions") shows the same list.
LAZY = {
    "numpy": "75 ms at import: the statistics and the traces' arrays need it, a plain pytest run does not",
    "scipy": "300 to 650 ms (scipy.special, scipy.stats): only the verdicts' statistics need it",
    "llama_cpp": "110 ms and llama.cpp's shared library: only an engine that loads a model needs it",
    "gguf": "145 ms (numpy with it): only writing the embedded model and reading a GGUF file's tensors need it",
    "httpx": "65 ms: only an HTTP engine's requests and a server's readiness check need it",
    "asyncio": "12 to 20 ms at import, ssl with it (asyncio.sslproto): only an HTTP engine's requests need it",
    "anyio": "httpx's async stack, imported ahead of the first timed async request (measuring.served)",
    "httpcore": "httpx's async stack, imported ahead of the first timed async request (measuring.served)",
    "psycopg": "the optional [postgres] extra (110 ms): only a postgresql:// history needs it",
    "matplotlib": "the optional [report] extra (200 to 400 ms): only the HTML report's charts need it",
    "xdist": "pytest-xdist, an optional plugin (100 ms): only its scheduler hook needs it",
    "fcntl": "POSIX only: where it is missing (Windows) each lock is skipped, so it is imported where it is used",
    "_pytest": "pytest's private findpaths, no API: a pytest without it costs only the project-root refinement",
    "pytest_llmperf.core.measurement": "core.measurement: 14 to 19 ms of its own (its frozen dataclasses), only a session that measures needs it",
    "pytest_llmperf.engines.http": "asyncio at its top",
    "pytest_llmperf.engines.servers": "asyncio at its top (engines.http)",
    "pytest_llmperf.measuring.worker": "core.measurement at its top",
    "pytest_llmperf.baselines.records": "numpy at its top (measuring.metrics, measuring.roofline)",
    "pytest_llmperf.engines.llama_cpp": "numpy at its top",
    "pytest_llmperf.engines.user_llama": "numpy at its top (engines.llama_cpp)",
    "pytest_llmperf.history.changepoints": "numpy at its top",
    "pytest_llmperf.history.database": "numpy and scipy at its top (baselines.records, judge.verdict)",
    "pytest_llmperf.history.series": "numpy and scipy at its top (history.database)",
    "pytest_llmperf.judge.ab": "numpy and scipy at its top",
    "pytest_llmperf.judge.attribution": "numpy and scipy at its top",
    "pytest_llmperf.judge.budgets": "numpy and scipy at its top",
    "pytest_llmperf.judge.parts": "numpy and scipy at its top",
    "pytest_llmperf.judge.regression": "numpy and scipy at its top (judge.verdict, judge.parts)",
    "pytest_llmperf.judge.result": "numpy and scipy at its top",
    "pytest_llmperf.judge.rule": "numpy and scipy at its top",
    "pytest_llmperf.judge.verdict": "numpy and scipy at its top",
    "pytest_llmperf.measuring.attribution": "numpy at its top",
    "pytest_llmperf.measuring.interleave": "numpy at its top (and a side imports it only after its import redirect)",
    "pytest_llmperf.measuring.layers": "numpy at its top",
    "pytest_llmperf.measuring.roofline": "numpy at its top",
    "pytest_llmperf.measuring.runner": "numpy at its top",
    "pytest_llmperf.measuring.served": "numpy at its top",
    "pytest_llmperf.reports.charts": "numpy at its top",
    "pytest_llmperf.reports.html": "numpy and scipy at its top (judge.result, history.series)",
    "pytest_llmperf.reports.profile": "numpy at its top (measuring.runner)",
    "pytest_llmperf.reports.session_file": "numpy and scipy at its top (judge.regression, judge.result)",
    "pytest_llmperf.reports.text": "numpy at its top (measuring.metrics, baselines.records)",
    "pytest_llmperf.reports.where": "numpy and scipy at its top (judge.parts, judge.result)",
    "pytest_llmperf.session.against": "numpy and scipy at its top (judge.ab, judge.paired)",
}
#: Modules of the package heavy by their own import, not by a dependency (their line in ``LAZY``
#: says how heavy): a module that imports one at its top is as heavy.
HEAVY_ITSELF = {"pytest_llmperf.core.measurement"}
HEAVY = {name for name in LAZY if not name.startswith("pytest_llmperf")} | HEAVY_ITSELF


def _at_top(name: str) -> set[str]:
    """The modules a module imports when it is imported: its statements outside functions and
    outside ``if TYPE_CHECKING:`` (a class body runs at import), and its parent packages."""
    path = MODULES[name]
    found = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        found |= _named(name, path, node)
        todo += ast.iter_child_nodes(node)
    return found


TOP = {name: _at_top(name) for name in MODULES}


def _heavy(module: str, seen: set[str] | None = None) -> set[str]:
    """The heavy dependencies importing ``module`` pulls in (``HEAVY``, by their top package)."""
    if module not in MODULES:
        return {module.split(".")[0]} & HEAVY
    seen = set() if seen is None else seen
    seen.add(module)
    return ({module} & HEAVY).union(*(_heavy(t, seen) for t in TOP[module] if t not in seen))


def _inside_functions() -> list[tuple[str, int, str]]:
    """(module, line, imported module) of every import inside a function of the package."""
    found = []
    for name, path in MODULES.items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for body in fn.body:
                    for node in ast.walk(body):
                        found += [(name, node.lineno, t) for t in sorted(_named(name, path, node))]
    return sorted(set(found))


INSIDE = _inside_functions()


def _listed(imported: str) -> str:
    return imported if imported.startswith("pytest_llmperf") else imported.split(".")[0]


def test_imports_inside_functions_are_listed():
    """An import sits inside a function only where it keeps a heavy dependency lazy: it names a
    module of ``LAZY``. Any other goes to the top of its module (an import circle or a layer it
    would break is a design problem to solve, not to hide in a function)."""
    unlisted = [f"{name}:{line} imports {imported}" for name, line, imported in INSIDE if _listed(imported) not in LAZY]
    assert unlisted == [], "\n".join(unlisted)


def test_an_import_inside_a_function_keeps_something_lazy():
    """What a function imports inside itself pulls a heavy dependency its module does not pull
    at its top already (in a module that imports numpy at its top, a numpy-only module is
    imported at the top too)."""
    idle = [
        f"{name}:{line} imports {imported}: {sorted(_heavy(imported))} comes with {name} already"
        for name, line, imported in INSIDE
        if _listed(imported) in LAZY and not _heavy(imported) - _heavy(name)
    ]
    assert idle == [], "\n".join(idle)


def test_the_list_of_lazy_imports_does_not_rot():
    """Each module of the package in ``LAZY`` imports a heavy dependency at its top, which its
    line names; each entry is imported inside some function (a heavy dependency, or at the top
    of a listed module)."""
    light = [
        m for m in LAZY if m in MODULES and not any(h.removeprefix("pytest_llmperf.") in LAZY[m] for h in _heavy(m))
    ]
    assert light == [], f"listed as heavy, but no heavy dependency named in their line comes at their top: {light}"
    pulled = set().union(*(_heavy(m) for m in LAZY if m in MODULES))
    unused = sorted(set(LAZY) - pulled - {_listed(imported) for _, _, imported in INSIDE})
    assert unused == [], f"listed, but imported inside no function: {unused}"
