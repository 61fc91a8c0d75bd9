"""Under pytest-xdist, llmperf tests share one worker (they would measure each other side by
side); ordinary tests still spread."""

from __future__ import annotations

import re
from collections import defaultdict

SUITE = """
import os
import pathlib
import time
import pytest

def tokens(prompt, max_tokens):
    for _ in range(max_tokens):
        time.sleep(0.001)
        yield "t"

@pytest.mark.parametrize("i", range(4))
@pytest.mark.llmperf(max_tokens=4, runs=2, warmup=0)
def test_perf(llmperf, i):
    llmperf.measure(engine=tokens)

@pytest.mark.parametrize("i", range(8))
def test_plain(i):
    time.sleep(0.1)
"""

#: Plain tests that wait until both workers have run one. Without it, "others spread" was
#: timing: on a busy machine the perf tests kept gw0 busy until gw1 had run all 8 plain ones.
#: xdist hands a worker more tests as its queue empties, so once gw0 is done with the perf
#: group it gets a plain test; if the plugin had put the plain tests in the perf group, no
#: second worker would ever come and they would fail after the deadline.
SPREAD = SUITE.replace(
    "    time.sleep(0.1)\n",
    """    seen = pathlib.Path(__file__).parent / "workers-seen"
    seen.mkdir(exist_ok=True)
    (seen / os.environ["PYTEST_XDIST_WORKER"]).touch()
    deadline = time.monotonic() + 120
    while len(list(seen.iterdir())) < 2:
        assert time.monotonic() < deadline, "the plain tests never reached a second worker"
        time.sleep(0.01)
""",
)


def workers(lines: list[str]) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = defaultdict(set)
    for line in lines:
        match = re.match(r"\[(gw\d+)\] .*PASSED (\S+)", line)
        if match:
            seen[match.group(2).split("[")[0].split("::")[-1]].add(match.group(1))
    return seen


def test_llmperf_tests_run_on_one_worker_others_spread(pytester):
    pytester.makepyfile(test_suite=SPREAD)
    result = pytester.runpytest_subprocess("-n", "2", "-v", "-p", "no:randomly")
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(
        ["llmperf: pytest-xdist --dist loadgroup: llmperf tests run on one worker, others spread"]
    )
    seen = workers(result.stdout.lines)
    assert len(seen["test_perf"]) == 1, seen
    assert seen["test_plain"] == {"gw0", "gw1"}, seen
    result.stdout.fnmatch_lines(["*llmperf summary*", "*test_perf*"])


def test_other_dist_modes_warn_only_with_llmperf_tests(pytester):
    pytester.makepyfile(test_suite=SUITE.replace("range(8)", "range(1)"))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile", "-p", "no:randomly")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["*llmperf: 4 perf test(s) under pytest-xdist --dist loadfile may run side by side*"])
    pytester.makepyfile(test_suite="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    assert "perf test(s) under pytest-xdist" not in result.stdout.str()
