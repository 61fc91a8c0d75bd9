"""Results named by their full node id: a module outside the rootdir given on the command
line has a pytest node id that does not name its folder (``::test_a`` for a file given by its
path, ``test_x.py::test_a`` for a folder), the same for two folders' ``test_x.py``; every
report names it by its path from the rootdir (``../a/test_x.py::test_a``), as the baseline
store and the history do (``baselines.store.unique_test_id``)."""

from __future__ import annotations

import json

import pytest
from inner import run

from pytest_llmperf.core.formats import full_id

MODULE = """
import pytest

@pytest.mark.llmperf(prompt_tokens=4, max_tokens={tokens}, runs=2, warmup=0)
def test_a():
    pass
"""


@pytest.mark.parametrize(
    "nodeid, module, named",
    [
        ("::test_a", "../a/test_x.py", "../a/test_x.py::test_a"),
        ("test_x.py::test_a", "../b/test_x.py", "../b/test_x.py::test_a"),
        ("test_x.py::TestK::test_a[x::y]", "../b/test_x.py", "../b/test_x.py::TestK::test_a[x::y]"),
        ("tests/test_x.py::test_a", "tests/test_x.py", "tests/test_x.py::test_a"),  # named already
        ("test_a", "x.py", "test_a"),  # no module part: as it is
    ],
)
def test_full_id_names_the_module_where_the_node_id_does_not(nodeid, module, named) -> None:
    assert full_id(nodeid, module) == named


@pytest.mark.parametrize("given", [("a/test_x.py", "b/test_x.py"), ("a", "b")], ids=["files", "folders"])
def test_a_session_report_names_two_same_named_modules_outside_the_rootdir_apart(
    pytester: pytest.Pytester, given
) -> None:
    root = pytester.path
    for name, tokens in (("a", 8), ("b", 9)):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text("")
        (root / name / "test_x.py").write_text(MODULE.format(tokens=tokens))
    (root / "ci").mkdir()
    result = run(
        pytester,
        f"--rootdir={root}/ci",
        "--llmperf-budgets-only",
        f"--llmperf-json={root}/s.json",
        "-p",
        "no:randomly",
        *given,
    )
    assert result.ret == 0, result.stdout.str()
    results = json.loads((root / "s.json").read_text())["results"]
    named = {r["test"]: r["record"]["workload"]["max_tokens"] for r in results}
    assert named == {"../a/test_x.py::test_a": 8, "../b/test_x.py::test_a": 9}, [r["test"] for r in results]
