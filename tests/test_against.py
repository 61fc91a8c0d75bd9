"""``--llmperf-against REF`` end to end: real git repositories of a few commits, real processes
(an inner ``python -m pytest`` run in the repository as a user runs it, and its two sides), real
llama.cpp (the tiny preset). What it measures, what it catches, and its faults: each one line,
nothing left behind (the sides' processes, the worktree's locks, the controller's temporary
files).

The inner sessions keep REF's worktrees under their own ``LLMPERF_CACHE_DIR`` (tmp_path), which
holds a link to the tiny model of the suite's cache; every side records its pid (the repository's
conftest.py), so the checks look at exactly these processes.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from inner import ctrl_c_default
from test_refs import _git_identity, git  # noqa: F401  (_git_identity: an autouse fixture, here too)

CHECKOUT = Path(__file__).resolve().parent.parent
SESSION_TIMEOUT_S = 240
W = "prompt_tokens=8, max_tokens=8"

#: The repository's conftest.py (the current tree's: both sides import it): each side writes its pid.
CONFTEST = """
import os

if "LLMPERF_SIDE" in os.environ and os.environ.get("AG_PIDS"):
    with open(os.environ["AG_PIDS"], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
"""

#: The user's wrapper around llama.cpp: ``EXTRA_MS`` of work per token; ``faulty_stream`` fails
#: in the ways listed in ``FAULTS`` at the commit that lists them, after two tokens.
WRAPPER = """
import os, signal, time

EXTRA_MS = {extra_ms}
FAULTS = {faults!r}
calls = {{}}  # per fault: a side runs the other tests' streams too (token by token, even when REF dies)


def spin(ms):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


def make_stream(llm):
    def stream(prompt, max_tokens):
        for chunk in llm(prompt, max_tokens=max_tokens, stream=True, temperature=0.0):
            spin(EXTRA_MS)
            yield chunk
    return stream


def faulty_stream(llm, fault):
    def stream(prompt, max_tokens):
        calls[fault] = calls.get(fault, 0) + 1
        for i, chunk in enumerate(llm(prompt, max_tokens=max_tokens, stream=True, temperature=0.0)):
            if i == 2 and fault in FAULTS:
                if fault == "segv":
                    os.kill(os.getpid(), signal.SIGSEGV)
                if fault == "hang":
                    time.sleep(3600)
                if fault == "raise" and calls[fault] == 2:
                    raise RuntimeError("the wrapper broke in its second run")
            yield chunk
    return stream


def check_setup():
    if "exit" in FAULTS:  # the test's own code ends the pytest session
        import pytest
        pytest.exit("the wrapper ended the session")
"""

VERDICT_TESTS = f"""
import pytest
from wrapper import make_stream


@pytest.mark.llmperf({W}, runs=6, warmup=1)
def test_wrapper(llmperf, llmperf_llm):
    llmperf.measure(make_stream(llmperf_llm))


@pytest.mark.llmperf({W}, runs=6, warmup=0)
def test_marker_only():
    pass


def test_keys(llmperf):
    llmperf.measure({W}, runs=4, warmup=0, max_runs=8)


def test_plain():
    assert 1 + 1 == 2
"""


def make_repo(root: Path, commits: list[tuple[str, dict[str, str | None]]]) -> list[str]:
    """One commit per (tag, files): each file's text (None removes it), tagged; returns the shas."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    shas = []
    for tag, files in commits:
        for name, text in files.items():
            path = root / name
            if text is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", tag)
        git(root, "tag", tag)
        shas.append(git(root, "rev-parse", "HEAD"))
    return shas


def wrapper(extra_ms: float = 0.0, faults: tuple[str, ...] = ()) -> str:
    return WRAPPER.format(extra_ms=extra_ms, faults=faults)


@pytest.fixture
def verdict_repo(tmp_path: Path) -> Path:
    """``base``: the wrapper adds nothing per token; ``slow`` (HEAD): 5 ms of work per token."""
    root = tmp_path / "repo"
    make_repo(
        root,
        [
            (
                "base",
                {"conftest.py": CONFTEST, "wrapper/__init__.py": wrapper(0.0), "tests/test_perf.py": VERDICT_TESTS},
            ),
            ("slow", {"wrapper/__init__.py": wrapper(5.0)}),
        ],
    )
    return root


@dataclass
class Inner:
    ret: int
    out: str
    pids: list[int]

    def lines(self, text: str) -> list[str]:
        return [line for line in self.out.splitlines() if text in line]


class Runner:
    """Inner sessions of one test: ``python -m pytest`` in the repository, its own cache (a link
    to the suite's tiny model), history off, its own temporary folder, the sides' pids."""

    def __init__(self, tmp_path: Path, model: Path) -> None:
        self.cache = tmp_path / "cache"
        self.cache.mkdir()
        (self.cache / model.name).symlink_to(model)
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        self.pid_file = tmp_path / "pids"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLMPERF_SIDE"))}
        env.update(
            LLMPERF_CACHE_DIR=str(self.cache),
            LLMPERF_HISTORY="off",
            LLMPERF_THREADS="1",
            COLUMNS="400",
            TMPDIR=str(self.tmp),
            AG_PIDS=str(self.pid_file),
            PYTHONPATH=os.pathsep.join([str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        )
        self.env = env

    def command(self, args: tuple[str, ...]) -> list[str]:
        # Thresholds of 50%: the injected change is 15x, and two processes of the tiny preset
        # (0.4 ms a token) measured an unchanged test up to 1.42x apart in CI. The false alarm
        # rate at the default 5% is measured on the small preset (benchmarks/against_sessions.py).
        limits = ("--llmperf-threshold=50%", "--llmperf-tail-threshold=50%")
        return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--llmperf-model", "tiny", *limits, *args]

    def pids(self) -> list[int]:
        return [int(x) for x in self.pid_file.read_text().split()] if self.pid_file.exists() else []

    def run(self, repo: Path, *args: str, timeout_s: float = SESSION_TIMEOUT_S) -> Inner:
        out = subprocess.run(
            self.command(args),
            cwd=repo,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        return Inner(out.returncode, out.stdout + out.stderr, self.pids())

    def popen(self, repo: Path, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(args),
            cwd=repo,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            preexec_fn=ctrl_c_default,  # noqa: PLW1509  (the caller's shell may ignore SIGINT)
        )

    def check_clean(self, repo: Path, pids: list[int], within_s: float = 15.0) -> None:
        """No side left, no worktree locked, no flock held, nothing left in the temporary folder."""
        deadline = time.monotonic() + within_s
        while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"side processes left behind: {left}"
        assert "locked" not in git(repo, "worktree", "list", "--porcelain")
        for lock in [*self.cache.glob("worktrees/*.lock"), *self.cache.glob("worktrees/*/*.inuse")]:
            with lock.open("a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: still held
        assert not list(self.tmp.glob("llmperf-*")), list(self.tmp.iterdir())


@pytest.fixture
def runner(tmp_path: Path, tiny_model_path: Path) -> Runner:
    return Runner(tmp_path, tiny_model_path)


def alive(pid: int) -> bool:
    """Running (a zombie, whoever's child it is, counts as gone)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


def failures(inner: Inner) -> dict[str, str]:
    """Each failed test's line in the short summary (``-rA``; pytest.fail's "Failed: " dropped)."""
    found = re.finditer(r"^FAILED \S*::(\w+) - (?:Failed: )?(.*)$", inner.out, re.MULTILINE)
    return {m.group(1): m.group(2) for m in found}


def outcome(inner: Inner, test: str) -> str:
    found = re.findall(rf"^(PASSED|FAILED|ERROR) \S*::{test}\b", inner.out, re.MULTILINE)
    return found[0] if found else "?"


def pairs_note(inner: Inner, test: str, ref: str) -> int:
    """The number of pairs the report names for ``test`` against ``ref``."""
    found = re.findall(rf"^{test}: against {re.escape(ref)}: (\d+) pairs interleaved", inner.out, re.MULTILINE)
    assert found, f"no pairs against {ref} for {test}:\n{inner.out}"
    return int(found[0])


# -- verdicts -------------------------------------------------------------------------------


def test_a_slower_wrapper_is_a_decode_regression_against_the_commit_before(runner: Runner, verdict_repo: Path) -> None:
    sha = git(verdict_repo, "rev-parse", "base")
    inner = runner.run(verdict_repo, "tests", "-rA", "--llmperf-against", "git:HEAD~1")
    out = inner.out
    assert inner.ret == 1, out
    ref = f"git:HEAD~1 ({sha[:12]})"
    for test in ("test_wrapper", "test_marker_only", "test_keys"):
        assert pairs_note(inner, test, ref) >= 4
    if len(os.sched_getaffinity(0)) > 1:  # 1 llama.cpp thread: both sides on the same idlest CPU
        for test in ("test_wrapper", "test_marker_only"):  # the wrapper's: the session's threads
            assert re.search(rf"^{test}: against .* each; both on CPU \d+; llama-cpp", out, re.MULTILINE), out
    assert outcome(inner, "test_wrapper") == "FAILED", out
    assert [outcome(inner, t) for t in ("test_marker_only", "test_keys", "test_plain")] == ["PASSED"] * 3, out
    assert re.search(r"^test_wrapper +decode TPOT \(ms\) .* REGRESSION$", out, re.MULTILINE), out
    assert re.search(r"FAILED tests/test_perf.py::test_wrapper - (prefill|decode) regression", out), out
    assert f"REF = {ref}: Python" in out and "wrapper from " + str(runner.cache / "worktrees") in out
    assert len(inner.pids) >= 2  # the sides, and each measurement's fresh process pairs (all closed)
    runner.check_clean(verdict_repo, inner.pids)


def test_the_same_commit_on_both_sides_is_no_regression(runner: Runner, verdict_repo: Path, tmp_path: Path) -> None:
    """``git:HEAD`` and this interpreter as ``python:PATH``, together: A/A, no REGRESSION; what each
    decision cost (pairs, seconds, the look it stopped at) in the against lines and the session file."""
    sha = git(verdict_repo, "rev-parse", "HEAD")
    ref = f"git:HEAD ({sha[:12]}), python:{sys.executable}"
    report = tmp_path / "session.json"
    inner = runner.run(
        verdict_repo,
        "tests",
        "-rA",
        "-k",
        "wrapper or marker",
        "--llmperf-against",
        f"git:HEAD,python:{sys.executable}",
        f"--llmperf-json={report}",
    )
    assert inner.ret == 0, inner.out
    counts = {t: pairs_note(inner, t, ref) for t in ("test_wrapper", "test_marker_only")}
    assert min(counts.values()) >= 6
    assert "REGRESSION" not in inner.out
    decisions = json.loads(report.read_text())["against"]["decisions"]
    assert [d["test"] for d in decisions] == [f"tests/test_perf.py::{t}" for t in counts]
    for d in decisions:
        test = d["test"].split("::")[1]
        assert d["pairs"] == counts[test] and d["seconds"] > 0 and 1 <= d["look"] <= d["looks"], d
        assert d["interleaved"] == "token", d  # both engines pause between tokens (docs/against.md)
        assert re.search(rf"^{test}: against .*: \d+ pairs interleaved token by token \(", inner.out, re.MULTILINE)
        line = f"llmperf: against: {d['test']}: {d['pairs']} pairs in {d['seconds']:.1f} s (look {d['look']} of {d['looks']}: "
        assert line in inner.out, inner.out
    runner.check_clean(verdict_repo, inner.pids)


AHEAD_TESTS = f"""
import queue, threading, time

import pytest


def ahead(llm):
    def stream(prompt, max_tokens):
        made = queue.Queue()

        def produce():
            llm.reset()
            for n, token in enumerate(llm.generate(llm.tokenize(prompt.encode()), temp=0.0), 1):
                made.put(token)
                time.sleep(0.005)
                if n >= max_tokens:
                    break
            made.put(None)

        worker = threading.Thread(target=produce)
        worker.start()
        try:
            while (token := made.get(timeout=60)) is not None:
                yield token
        finally:
            worker.join(timeout=60)
    return stream


@pytest.mark.llmperf({W}, runs=6, warmup=1)
def test_ahead(llmperf, llmperf_llm):
    llmperf.measure(ahead(llmperf_llm))
"""


def test_each_side_runs_in_two_processes_and_what_each_level_contributed_is_kept(
    runner: Runner, verdict_repo: Path, tmp_path: Path
) -> None:
    """The process as a level (issue 50): A/A with a budget of 4, the pairs in blocks, each block
    on a fresh pair of side processes (the first on the test's own); their start-up said and kept
    apart from the pairs' seconds; the levels printed with -v and kept in the session file."""
    runner.env["LLMPERF_MAX_PROCESSES"] = "4"
    report = tmp_path / "session.json"
    inner = runner.run(
        verdict_repo, "tests", "-rA", "-v", "-k", "marker", "--llmperf-against", "git:HEAD", f"--llmperf-json={report}"
    )
    assert inner.ret == 0, inner.out
    (decision,) = json.loads(report.read_text())["against"]["decisions"]
    k = decision["processes"]  # a block on each: 2 or more, at most the budget of 4
    assert 2 <= k <= 4 and decision["start_s"] > 0, decision
    assert len(inner.pids) == 2 * k, inner.pids  # the test's own pair of sides, and k - 1 more for its measurement
    assert {one["metric"] for one in decision["levels"]} >= {"ttft_ms", "tpot_ms"}, decision
    for one in decision["levels"]:
        assert one["process_pairs"] == k and one["pairs"] == decision["pairs"] and 0 <= one["between_share"] <= 1
    assert re.search(
        rf"^test_marker_only: against .*; {k} process pair\(s\) of at most 4, .* start \d+\.\d s",
        inner.out,
        re.MULTILINE,
    )
    test = decision["test"]
    assert f"llmperf: against: {test}: {decision['pairs']} pairs in " in inner.out
    assert f"; {k} process pairs, the extra ones started in {decision['start_s']:.1f} s" in inner.out
    assert re.search(
        rf"^llmperf: against: {re.escape(test)}: decode TPOT: between {k} process pairs sd ", inner.out, re.MULTILINE
    )
    from pytest_llmperf.reports.session_file import load_session

    assert len(load_session(report)) == 1  # validated against the schema
    runner.check_clean(verdict_repo, inner.pids)


def test_a_wrapper_that_makes_tokens_ahead_of_its_reader_is_paired_run_by_run(runner: Runner, tmp_path: Path) -> None:
    """Token by token needs an engine that computes nothing while paused: a wrapper whose thread
    makes the tokens (as a server streams them) shows that it did at its first stepped run (the
    Llama's counters moved during a pause); its pairs are then whole runs, and the note says why."""
    root = tmp_path / "repo"
    make_repo(root, [("base", {"conftest.py": CONFTEST, "tests/test_perf.py": AHEAD_TESTS})])
    report = tmp_path / "session.json"
    inner = runner.run(root, "tests", "-rA", "--llmperf-against", "git:HEAD", f"--llmperf-json={report}")
    assert inner.ret == 0, inner.out
    assert re.search(
        r"^test_ahead: against .*: \d+ pairs interleaved run by run \(not token by token: side \w+ .*"
        r"ran llama.cpp while paused between tokens",
        inner.out,
        re.MULTILINE,
    ), inner.out
    (decision,) = json.loads(report.read_text())["against"]["decisions"]
    assert decision["interleaved"] == "run" and decision["pairs"] >= 6, decision
    runner.check_clean(root, inner.pids)


def test_another_interpreter_alone(runner: Runner, verdict_repo: Path) -> None:
    inner = runner.run(verdict_repo, "tests", "-k", "marker", "--llmperf-against", f"python:{sys.executable}")
    assert inner.ret == 0, inner.out
    assert pairs_note(inner, "test_marker_only", f"python:{sys.executable}") >= 6
    assert f"REF = python:{sys.executable}: Python {sys.version.split()[0]}" in inner.out
    runner.check_clean(verdict_repo, inner.pids)


def test_under_xdist_the_llmperf_tests_stay_on_one_worker(runner: Runner, verdict_repo: Path) -> None:
    runner.env["LLMPERF_MAX_PROCESSES"] = "1"  # the sides a worker starts (the process level: test_each_side_runs_...)
    inner = runner.run(verdict_repo, "tests", "-n", "2", "-v", "--llmperf-against", "git:HEAD~1")
    out = inner.out
    assert inner.ret == 1, out
    workers = {m.group(2): m.group(1) for m in re.finditer(r"\[(gw\d)\] .*?(?:PASSED|FAILED) \S*::(\w+)", out)}
    assert {workers["test_wrapper"], workers["test_marker_only"], workers["test_keys"]} == {workers["test_wrapper"]}, (
        out
    )
    assert "test_plain" in workers
    assert re.search(r"FAILED tests/test_perf.py::test_wrapper - (prefill|decode) regression", out), out
    assert len(inner.pids) == 2  # one worker ran the llmperf tests: one pair of sides
    runner.check_clean(verdict_repo, inner.pids)


LOAD_TESTS = f"""
import pytest


@pytest.mark.llmperf({W}, runs=2, warmup=0, max_load_ms=0.001)
def test_load_budget():
    pass


@pytest.mark.llmperf({W}, runs=2, warmup=0, model_load="cold", max_load_ms=600000)
def test_cold_load():
    pass
"""


def test_a_load_budget_is_checked_on_each_side_after_its_pairs(runner: Runner, tmp_path: Path) -> None:
    """``max_load_ms`` and ``model_load`` under ``--llmperf-against``: each side times its own fresh
    loads after the pairs (never between them), so the current side's budget sees a measured
    median, not "not measured"."""
    root = tmp_path / "repo"
    make_repo(root, [("base", {"conftest.py": CONFTEST, "tests/test_load.py": LOAD_TESTS})])
    inner = runner.run(root, "tests", "-rA", "--llmperf-against", f"python:{sys.executable}")
    out = inner.out
    assert inner.ret == 1, out
    assert outcome(inner, "test_load_budget") == "FAILED" and outcome(inner, "test_cold_load") == "PASSED", out
    assert re.search(r"model load median [\d.]+ ms > budget 0\.001 ms \([2-5] loads, warm\)", out), out
    assert "was not measured" not in out, out
    assert pairs_note(inner, "test_load_budget", f"python:{sys.executable}") >= 2
    runner.check_clean(root, inner.pids)


AGREEMENT_TESTS = """
import pytest
from pick import MODEL

KEYS = dict(prompt_tokens=8, max_tokens=8, runs=4, warmup=0)


def stream(prompt, max_tokens):
    yield from ["x"] * max_tokens


@pytest.mark.llmperf(**KEYS, min_top1_agreement=1.0, max_kl=0.0, max_kl_p99=0.0)
def test_same():
    pass


@pytest.mark.llmperf(**KEYS, min_top1_agreement=0.9)
def test_model(llmperf):
    llmperf.measure(model=MODEL)  # the code under test names the model: other weights at HEAD


@pytest.mark.llmperf(**KEYS, min_top1_agreement=0.9)
def test_callable(llmperf):
    llmperf.measure(stream)
"""


def test_output_agreement_with_ref_is_a_figure_and_a_budget(runner: Runner, tmp_path: Path) -> None:
    """Each measurement's outputs against REF's (teacher-forced on REF's tokens, after the
    pairs): A/A exactly 1 and 0 (budgets met); another model at HEAD (the code under test picks
    it) near chance, caught by ``min_top1_agreement`` in one line naming both sides; a callable
    exposes no probabilities: its budget fails saying so. In the terminal section (80 columns),
    the JSON figures (schema), JUnit, Markdown and HTML."""
    import dataclasses
    import json
    import xml.etree.ElementTree as ET

    from pytest_llmperf.models.gguf import PRESETS, ensure_model
    from pytest_llmperf.reports.session_file import load_session

    other = ensure_model(dataclasses.replace(PRESETS["tiny"], seed=1))
    root = tmp_path / "repo"
    files = {"conftest.py": CONFTEST, "pick/__init__.py": 'MODEL = "tiny"\n', "tests/test_out.py": AGREEMENT_TESTS}
    make_repo(root, [("base", files), ("other", {"pick/__init__.py": f"MODEL = {str(other)!r}\n"})])
    reports = (
        "--llmperf-json",
        "s.json",
        "--junitxml",
        "j.xml",
        "--llmperf-markdown",
        "s.md",
        "--llmperf-html",
        "s.html",
    )
    inner = runner.run(root, "tests", "-rA", "--llmperf-against", "git:HEAD~1", *reports)
    out = inner.out
    assert inner.ret == 1, out
    assert [outcome(inner, t) for t in ("test_same", "test_model", "test_callable")] == ["PASSED", *["FAILED"] * 2]
    lines = failures(inner)
    assert re.fullmatch(
        r"top-1 agreement of B \[this tree\] with A \[REF\] 0\.\d{4} < min_top1_agreement 0\.9 "
        r"\(32 positions over 4 prompts\)",
        lines["test_model"],
    ), lines
    assert lines["test_callable"].startswith(
        "min_top1_agreement 0.9: B [this tree] vs A [REF]: agreement not available"
    ), lines
    assert "exposes no token probabilities" in lines["test_callable"], lines
    assert "the test failed there" not in out, out  # REF's side judges no agreement budget
    head = "output against REF (A: REF, B: this tree; exact, full vocabulary)"
    assert f"{head}\n  greedy parity 1.0000; first divergence: none\n" in out, out  # test_same
    assert re.search(
        rf"^{re.escape(head)}\n  greedy parity 0\.\d{{4}}; first divergence: token \d+ \(", out, re.MULTILINE
    ), out
    assert re.search(r"^top-1 agreement +share +1(?:\.0+)? +32 positions over 4 prompts$", out, re.MULTILINE), out
    assert re.search(r"^KL\(REF\|\|this\) mean +nats +0 +32 positions over 4 prompts$", out, re.MULTILINE), out
    assert "output against REF: not available (side A [REF git:HEAD~1" in out, out
    assert len(load_session(root / "s.json")) == 3  # validated against the schema
    figures = {r["test"].split("::")[1]: r["figures"] for r in json.loads((root / "s.json").read_text())["results"]}
    same, model, called = figures["test_same"], figures["test_model"], figures["test_callable"]
    assert (same["top1_agreement"], same["kl_mean"], same["kl_p99"], same["greedy_parity"]) == (1.0, 0.0, 0.0, 1.0)
    assert same["agreement_positions"] == 32 and same["agreement"] == "exact, full vocabulary"
    assert model["top1_agreement"] < 0.5 and model["kl_mean"] > 0.01 and model["agreement_positions"] == 32
    assert called["top1_agreement"] is None and called["agreement"].startswith("not available: side A [REF")
    props = {
        (case.get("name"), p.get("name")): p.get("value")
        for case in ET.parse(root / "j.xml").iter("testcase")
        for p in case.iter("property")
    }
    assert props[("test_same", "llmperf.top1_agreement")] == "1.0" and props[("test_same", "llmperf.kl_mean")] == "0.0"
    md = (root / "s.md").read_text()
    table = md[md.index("### Output agreement with REF (A: REF, B: this tree)") :]
    assert re.search(
        r"^\| `tests/test_out.py::test_same` \| 1\.0000 \| 0 \| 0 \| 1\.0000 \| 32 \| exact", table, re.MULTILINE
    )
    assert re.search(r"^\| `tests/test_out.py::test_callable` \| n/a .* not available: side A", table, re.MULTILINE), (
        table
    )
    page = (root / "s.html").read_text()
    assert "Output agreement with REF" in page and "<td>tests/test_out.py::test_same</td><td>1.0000</td>" in page
    runner.check_clean(root, inner.pids)


# -- faults ---------------------------------------------------------------------------------


def test_a_rev_that_does_not_exist_is_a_usage_error(runner: Runner, verdict_repo: Path) -> None:
    inner = runner.run(verdict_repo, "tests", "--llmperf-against", "git:no-such-rev")
    assert inner.ret == 4, inner.out
    lines = [ln for ln in inner.out.splitlines() if ln.strip()]
    assert len(lines) == 1 and "git:no-such-rev" in lines[0] and "no commit 'no-such-rev'" in lines[0], inner.out
    assert inner.pids == []
    runner.check_clean(verdict_repo, [])


FAULT_TESTS = f"""
import pytest
from wrapper import check_setup, faulty_stream


@pytest.mark.llmperf({W}, runs=3, warmup=0, max_runs=3)
def test_1_segv(llmperf, llmperf_llm):
    llmperf.measure(faulty_stream(llmperf_llm, "segv"))


@pytest.mark.llmperf({W}, runs=6, warmup=0, max_runs=6)
def test_2_after_segv():
    pass


@pytest.mark.llmperf({W}, runs=3, warmup=0, max_runs=3)
def test_3_hang(llmperf, llmperf_llm):
    llmperf.measure(faulty_stream(llmperf_llm, "hang"))


@pytest.mark.llmperf({W}, runs=6, warmup=0, max_runs=6)
def test_4_after_hang():
    pass


@pytest.mark.llmperf({W}, runs=3, warmup=0, max_runs=3)
def test_5_raise(llmperf, llmperf_llm):
    llmperf.measure(faulty_stream(llmperf_llm, "raise"))


@pytest.mark.llmperf({W}, runs=6, warmup=0, max_runs=6)
def test_6_after_raise():
    pass


@pytest.mark.llmperf({W}, runs=3, warmup=0, max_runs=3)
def test_7_exit(llmperf):
    check_setup()
    llmperf.measure()


@pytest.mark.llmperf({W}, runs=6, warmup=0, max_runs=6)
def test_8_after_exit():
    pass
"""

MARKER_ONLY = f"""
import pytest
{{imports}}


@pytest.mark.llmperf({W}, runs=3, warmup=0, max_runs=3)
def test_{{name}}():
    pass
"""


def test_faults_fail_their_test_and_the_others_go_on(runner: Runner, tmp_path: Path) -> None:
    """At REF the wrapper dies with SIGSEGV in one test, hangs in another and ends the pytest session
    in a third (before its measurement, while this tree's side waits at its own), a package fails to
    import (ImportError in it, a syntax error in another), and a name the current tests import is
    missing; at HEAD the wrapper raises in one run of a test. Each fails its test with one line
    naming the side (the missing name: not compared, measured here alone), the side is started
    again, and the tests after each are compared."""
    root = tmp_path / "repo"
    shas = make_repo(
        root,
        [
            (
                "faulty",
                {
                    "conftest.py": CONFTEST,
                    "wrapper/__init__.py": wrapper(0.0, ("segv", "hang", "exit")),
                    "helper/__init__.py": "raise ImportError('helper needs libfoo')\n",
                    "syntaxy/__init__.py": "def broken(:\n    pass\n",
                    "tests/test_faults.py": FAULT_TESTS,
                    "tests/test_helper.py": MARKER_ONLY.format(imports="import helper", name="helper"),
                    "tests/test_syntaxy.py": MARKER_ONLY.format(imports="import syntaxy", name="syntaxy"),
                },
            ),
            (
                "head",
                {
                    "wrapper/__init__.py": wrapper(0.0, ("raise",)) + "\n\ndef new_api():\n    return 1\n",
                    "helper/__init__.py": "VALUE = 1\n",
                    "syntaxy/__init__.py": "def broken():\n    pass\n",
                    "tests/test_new_api.py": MARKER_ONLY.format(imports="from wrapper import new_api", name="new_api"),
                },
            ),
        ],
    )
    started = time.monotonic()
    runner.env["LLMPERF_MAX_PROCESSES"] = "1"  # how often each side starts after a fault (no fresh process pairs)
    inner = runner.run(
        # 10 s: at a load of 11 on 2 cores REF's pytest took over 5 s to end its session (test_7_exit).
        root,
        "tests",
        "-rA",
        "--llmperf-engine-timeout=10",
        "--durations=0",
        "--llmperf-against",
        "git:faulty",
    )
    out = inner.out
    assert inner.ret == 1, out
    ref = f"side REF (git:faulty ({shas[0][:12]}))"
    failed = failures(inner)
    assert sorted(failed) == [
        "test_1_segv",
        "test_3_hang",
        "test_5_raise",
        "test_7_exit",
        "test_helper",
        "test_syntaxy",
    ], out
    assert failed["test_1_segv"].startswith(f"{ref} died with SIGSEGV"), failed
    assert "while run 0 (in stream at wrapper/__init__.py:" in failed["test_1_segv"], (
        failed
    )  # the fault handler's frame
    assert failed["test_3_hang"].startswith(f"{ref} did not answer within 10 s"), failed
    assert failed["test_5_raise"].startswith(
        "not measured: side current (this tree): RuntimeError: the wrapper broke in its second run"
    ), failed
    assert failed["test_7_exit"].startswith(
        f"{ref} ended its pytest session (exit status 2) while running tests/test_faults.py::test_7_exit"
    ), failed
    assert failed["test_helper"].startswith(f"{ref} cannot import tests/test_helper.py"), failed
    assert "ImportError: helper needs libfoo" in out
    assert failed["test_syntaxy"].startswith(f"{ref} cannot import tests/test_syntaxy.py"), failed
    assert "SyntaxError" in out
    for test in ("test_2_after_segv", "test_4_after_hang", "test_6_after_raise", "test_8_after_exit"):
        assert outcome(inner, test) == "PASSED", out
        assert pairs_note(inner, test, f"git:faulty ({shas[0][:12]})") == 6
    # The current tests import a name REF lacks: measured here alone, passed, one line.
    assert outcome(inner, "test_new_api") == "PASSED", out
    notes = inner.lines("not compared: ")
    assert any(f"{ref} cannot collect tests/test_new_api.py" in n and "new_api" in n for n in notes), out
    hang_s = float(re.search(r"^([\d.]+)s call +\S*::test_3_hang$", out, re.MULTILINE).group(1))
    assert hang_s < 10 + 10, out
    # REF's side four times (the first, after the crash, the hang and the exit), this tree's once.
    assert len(inner.pids) == 5, inner.pids
    assert time.monotonic() - started < SESSION_TIMEOUT_S
    runner.check_clean(root, inner.pids)


def test_a_ref_whose_conftest_cannot_import_fails_each_llmperf_test(runner: Runner, tmp_path: Path) -> None:
    """REF's pytest stops before its first test (the current conftest.py imports a package that
    fails at REF): each llmperf test fails with that one line, REF is not started again per test,
    and the plain test passes."""
    root = tmp_path / "repo"
    conftest = CONFTEST + "\nimport helper  # noqa\n"
    shas = make_repo(
        root,
        [
            (
                "broken",
                {
                    "conftest.py": conftest,
                    "helper/__init__.py": "raise ImportError('helper needs libfoo')\n",
                    "tests/test_a.py": MARKER_ONLY.format(imports="", name="a"),
                    "tests/test_b.py": MARKER_ONLY.format(imports="", name="b") + "\n\ndef test_plain():\n    pass\n",
                },
            ),
            ("fixed", {"helper/__init__.py": "VALUE = 1\n"}),
        ],
    )
    runner.env["LLMPERF_MAX_PROCESSES"] = "1"  # how often REF's side starts (no fresh process pairs)
    inner = runner.run(root, "tests", "-rA", "--llmperf-against", "git:broken")
    out = inner.out
    assert inner.ret == 1, out
    ref = f"side REF (git:broken ({shas[0][:12]}))"
    failed = failures(inner)
    assert sorted(failed) == ["test_a", "test_b"], out
    for line in failed.values():
        assert line.startswith(f"{ref} did not start"), line
    assert "ImportError: helper needs libfoo" in out
    assert outcome(inner, "test_plain") == "PASSED"
    assert len(inner.pids) == 2, inner.pids  # REF's side was started once, not again for each test
    runner.check_clean(root, inner.pids)


SLOW_TESTS = f"""
import os, time
import pytest


def slow_stream(prompt, max_tokens):
    folder = os.environ["AG_STARTED"]
    open(os.path.join(folder, str(os.getpid())), "w").close()
    if os.path.exists(os.path.join(folder, "stall")):  # a run that stays in the side's clock reads
        open(os.path.join(folder, f"stalled-{os.getpid()}"), "w").close()
        time.sleep(120)
    for i in range(max_tokens):
        time.sleep(0.02)
        yield i


@pytest.mark.llmperf({W}, runs=60, warmup=0, max_runs=60)
def test_long(llmperf):
    llmperf.measure(slow_stream)
"""


@pytest.fixture
def slow_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    make_repo(
        root,
        [
            ("one", {"conftest.py": CONFTEST, "wrapper/__init__.py": wrapper(), "tests/test_slow.py": SLOW_TESTS}),
            ("two", {"wrapper/__init__.py": wrapper(1.0)}),
        ],
    )
    return root


def _mid_measurement(runner: Runner, repo: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], list[int], Path]:
    """A session both of whose sides are measuring (each has begun a run)."""
    started = tmp_path / "started"
    started.mkdir()
    runner.env["AG_STARTED"] = str(started)
    runner.env["LLMPERF_MAX_PROCESSES"] = "1"  # the test's own two sides, and no fresh process pair
    proc = runner.popen(repo, "tests", "--llmperf-against", "git:one")
    deadline = time.monotonic() + 120
    while len(list(started.glob("[0-9]*"))) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the sides did not both start measuring:\n{proc.communicate()[0]}")
        time.sleep(0.05)
    pids = runner.pids()
    assert len(pids) == 2 and sorted(pids) == sorted(int(p.name) for p in started.glob("[0-9]*"))
    assert all(alive(p) for p in pids)
    return proc, pids, started


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_measurement_ends_the_session_and_its_sides(
    runner: Runner, slow_repo: Path, tmp_path: Path, signum: int
) -> None:
    proc, pids, _ = _mid_measurement(runner, slow_repo, tmp_path)
    proc.send_signal(signum)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the controller did not end within 30 s of {signal.Signals(signum).name}")
    assert proc.returncode == 2, out  # pytest's "interrupted"
    assert "KeyboardInterrupt" in out and "Traceback" not in out.split("KeyboardInterrupt")[0], out
    runner.check_clean(slow_repo, pids, within_s=5)


def test_sigkill_of_the_controller_takes_its_sides_with_it(runner: Runner, slow_repo: Path, tmp_path: Path) -> None:
    """One side is inside a run that lasts two minutes, the other waits for its next one."""
    proc, pids, started = _mid_measurement(runner, slow_repo, tmp_path)
    (started / "stall").touch()
    deadline = time.monotonic() + 60
    while not list(started.glob("stalled-*")):
        assert time.monotonic() < deadline and proc.poll() is None, "no side began the stalled run"
        time.sleep(0.05)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], "PR_SET_PDEATHSIG did not end the sides"
    assert "locked" not in git(slow_repo, "worktree", "list", "--porcelain")
    # The plugin's link for the sides lives in the cache, made once: nothing of it left in $TMPDIR.
    assert not list(runner.tmp.glob("llmperf-harness-*")), list(runner.tmp.iterdir())
    assert (runner.cache / "harness").is_dir()


SET_TESTS = """
import pytest

SET = [{"prompt": " ".join(["word"] * n)} for n in (4, 30, 120)]


@pytest.mark.llmperf(prompt_set=SET, max_tokens=4, runs=6, warmup=1, max_runs=6)
def test_set():
    pass
"""


def test_a_prompt_sets_pairs_are_kept_and_drawn_against_ref(runner: Runner, tmp_path: Path) -> None:
    """A prompt set against REF: the decision keeps each side's runs by request (its prompt tokens
    and TTFT, run i of each the same request), and the HTML report draws REF's beside this tree's
    TTFT against prompt length (neither side keeps a record there)."""
    from pytest_llmperf.core.workload import Workload, drawn, prompt_set_requests
    from pytest_llmperf.reports.session_file import load_session

    root = tmp_path / "repo"
    make_repo(root, [("base", {"conftest.py": CONFTEST, "tests/test_set.py": SET_TESTS})])
    runner.env["LLMPERF_MAX_PROCESSES"] = "1"
    args = ("--llmperf-json", "s.json", "--llmperf-html", "s.html")
    inner = runner.run(root, "tests", "-rA", "--llmperf-against", "git:HEAD", *args)
    assert inner.ret == 0, inner.out
    (decision,) = json.loads((root / "s.json").read_text())["against"]["decisions"]
    kept, n = decision["by_request"], decision["pairs"]
    w = Workload(prompt_set=prompt_set_requests([{"prompt": " ".join(["word"] * k)} for k in (4, 30, 120)]))
    assert kept["request"] == [drawn(w.prompt_set, w.seed, i) for i in range(n)]
    lengths = kept["REF"]["prompt_tokens"]
    assert lengths == kept["current"]["prompt_tokens"] and len(lengths) == n and len(set(lengths)) > 1
    assert all(len(kept[side]["ttft_ms"]) == n and min(kept[side]["ttft_ms"]) > 0 for side in ("REF", "current"))
    assert len(load_session(root / "s.json")) == 1  # validated against the schema
    page = (root / "s.html").read_text(encoding="utf-8")
    assert "TTFT against prompt length, this tree vs REF" in page
    assert f"REF ({n} runs)" in page and f"this tree ({n} runs)" in page
    runner.check_clean(root, inner.pids)
