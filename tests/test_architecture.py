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
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            subs = {f"{module}.{a.name}" for a in node.names} & set(MODULES)
            found |= subs if len(subs) == len(node.names) else subs | {module}
    return found


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
