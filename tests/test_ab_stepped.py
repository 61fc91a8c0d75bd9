"""The in-process A/B token by token (``measuring.interleave.interleave``, docs/ab.md "The run"):
where both engines can pause between tokens (``SteppedRuns``), the two runs of a pair take turns
step by step, as ``--llmperf-against``'s pairs do; else, and from the first run that could not
pause, whole runs; the A/B's line, its session JSON entry and its JUnit properties say which.

The simulated engines make up their clock readings (nothing sleeps, nothing is timed): each step
reads a machine whose speed drifts from step to step, shared by both sides in the order they
step."""

from __future__ import annotations

import html
import json
import re
import threading
from collections.abc import Callable

import numpy as np
import pytest
from inner import run

from pytest_llmperf import LlamaCppEngine, Workload
from pytest_llmperf.core.errors import EngineError, NotSteppable
from pytest_llmperf.core.workload import EngineInfo, RunTrace
from pytest_llmperf.engines.capabilities import SteppedRuns
from pytest_llmperf.judge.ab import Side, as_dict, compare_ab, properties
from pytest_llmperf.measuring.interleave import Interleaved, interleave
from pytest_llmperf.reports.html import ab_section
from pytest_llmperf.reports.session_file import ab_markdown_lines, ab_pairs_line

W = Workload(prompt_tokens=32, max_tokens=12, runs=16, warmup=1, seed=7)


class StepMachine:
    """A machine whose speed drifts within tenths of a second: a log speed that walks from step
    to step (AR(1), 6% a step, 0.97 kept), shared by every engine in the order they step. It
    also checks that no two steps overlap and logs each step as (side, step)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.log_speed = 0.0
        self.steps: list[tuple[str, int]] = []
        self.active = 0

    def step(self, side: str, k: int, ms: float) -> int:
        self.active += 1
        assert self.active == 1, "two steps at once"
        self.log_speed = 0.97 * self.log_speed + float(self.rng.normal(0.0, 0.06))
        self.steps.append((side, k))
        self.active -= 1
        return int(ms * float(np.exp(self.log_speed)) * 1e6)


class WholeEngine:
    """A simulated llama.cpp in this process: ``prefill_ms`` for the prompt, ``token_ms`` a
    token, at the machine's speed of each step; whole runs only."""

    def __init__(self, machine: StepMachine, name: str, slower: float = 1.0) -> None:
        self.machine, self.name, self.slower = machine, name, slower
        self.fail: tuple[int, Exception] | None = None  # (pause number, raised there) in a stepped run
        self._info = EngineInfo(engine="simulated", model=name)

    def info(self) -> EngineInfo:
        return self._info

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        return self._steps(workload, None)

    def _steps(self, workload: Workload, pause: Callable[[], None] | None) -> RunTrace:
        stamps: list[int] = []
        now = 0
        for k in range(workload.max_tokens + 1):  # the prompt (k = 0), then each token
            if pause is not None:
                if self.fail is not None and self.fail[0] == k:
                    raise self.fail[1]
                pause()
            now += self.machine.step(self.name, k, (100.0 if k == 0 else 10.0) * self.slower)
            stamps.append(now)
        return RunTrace(start_ns=0, prefill_done_ns=stamps[0], token_ns=tuple(stamps[1:]), prompt_tokens=32)


class SteppedEngine(WholeEngine):
    """The same engine, pausing between tokens (``SteppedRuns``)."""

    def run_stepped(self, workload: Workload, run_index: int, pause: Callable[[], None]) -> RunTrace:
        return self._steps(workload, pause)


def test_both_stepped_sides_take_turns_token_by_token() -> None:
    machine = StepMachine(1)
    a, b = SteppedEngine(machine, "a"), SteppedEngine(machine, "b")
    assert isinstance(a, SteppedRuns)
    before = threading.active_count()
    pairs = interleave(a, b, W, W.seed)
    assert pairs.interleaved is Interleaved.TOKEN and pairs.unstepped is None
    assert len(pairs.a) == len(pairs.b) == W.runs and len(pairs.a_warm) == len(pairs.b_warm) == W.warmup
    per_pair = 2 * (W.max_tokens + 1)
    assert len(machine.steps) == per_pair * (W.runs + W.warmup)
    warm_order = "".join(s for s, k in machine.steps[:per_pair] if k == 0).upper()
    for i, order in enumerate((warm_order, *pairs.orders)):
        steps = machine.steps[i * per_pair : (i + 1) * per_pair]
        first, second = order[0].lower(), order[1].lower()
        # The prompts in the pair's order, then one token of each, the order turning at every step.
        expected = [(first, 0), (second, 0)]
        for k in range(1, W.max_tokens + 1):
            expected += [(second, k), (first, k)] if k % 2 else [(first, k), (second, k)]
        assert steps == expected, (i, order)
    assert threading.active_count() == before  # every run's thread ended


def _decode_spread(stepped: bool, seed: int) -> float:
    machine = StepMachine(seed)
    kind = SteppedEngine if stepped else WholeEngine
    r = compare_ab(Side("a", kind(machine, "a")), Side("b", kind(machine, "b")), W, agreement=False)
    assert r.interleaved is (Interleaved.TOKEN if stepped else Interleaved.RUN)
    return r.decode.ci_high / r.decode.ci_low


def test_a_drift_between_steps_cancels_token_by_token_and_not_in_whole_runs() -> None:
    """The same drifting machine, A/A: the decode CI token by token is far narrower than that of
    whole runs, where the two runs of a pair see different speeds."""
    stepped = [_decode_spread(True, seed) for seed in range(6)]
    whole = [_decode_spread(False, seed) for seed in range(6)]
    assert np.median(stepped) - 1 < (np.median(whole) - 1) / 2, (stepped, whole)


def test_a_per_token_slowdown_is_found_token_by_token() -> None:
    machine = StepMachine(3)
    r = compare_ab(
        Side("a", SteppedEngine(machine, "a")),
        Side("b", SteppedEngine(machine, "b", slower=1.08)),
        W,
        agreement=False,
        max_slowdown=0.02,
    )
    assert r.interleaved is Interleaved.TOKEN
    assert r.decode.ci_low > 1.02 and 1.04 < r.decode.ratio < 1.12
    assert "decode" in {o.budget.target for o in r.failed}


def test_a_run_that_cannot_pause_ends_token_by_token_and_says_why() -> None:
    machine = StepMachine(2)
    a, b = SteppedEngine(machine, "a"), SteppedEngine(machine, "b")
    b.fail = (3, NotSteppable("'b' ran llama.cpp while paused between tokens"))
    before = threading.active_count()
    r = compare_ab(Side("a", a), Side("b", b), W, agreement=False)
    assert r.interleaved is Interleaved.RUN
    assert r.unstepped == "side B [b]: 'b' ran llama.cpp while paused between tokens"
    assert r.a.n_runs == r.b.n_runs == W.runs
    line = r.lines()[2]
    assert "pairs interleaved (" in line and f"seeded) run by run (not token by token: {r.unstepped}) after" in line
    entry = as_dict(r)
    assert entry["interleaved"] == "run" and entry["unstepped"] == r.unstepped
    assert ("llmperf.ab.interleaved", "run") in properties([r])
    assert threading.active_count() == before  # the first side's run was let end, its thread joined


def test_a_side_that_cannot_pause_runs_whole_runs_and_is_named() -> None:
    machine = StepMachine(4)
    r = compare_ab(Side("a", SteppedEngine(machine, "a")), Side("plain", WholeEngine(machine, "b")), W, agreement=False)
    assert r.interleaved is Interleaved.RUN
    assert r.unstepped == "side B [plain] cannot pause between tokens"

    class Counted(SteppedEngine):
        def run(self, workload: Workload, run_index: int) -> RunTrace:
            return super().run(workload, run_index)

    r = compare_ab(Side("a", SteppedEngine(machine, "a")), Side("own", Counted(machine, "b")), W, agreement=False)
    assert r.unstepped == "side B [own] has a run of its own (Counted.run) that its steps would leave out"
    one = SteppedEngine(machine, "same")
    r = compare_ab(Side("a", one), Side("b", one), W, agreement=False)
    assert r.unstepped == "both sides are one engine, which holds one run at a time"


def test_an_error_in_a_stepped_run_is_raised_after_the_other_run_ended() -> None:
    machine = StepMachine(5)
    a, b = SteppedEngine(machine, "a"), SteppedEngine(machine, "b")
    a.fail = (2, EngineError("llama.cpp failed to decode"))
    before = threading.active_count()
    with pytest.raises(EngineError, match="failed to decode"):
        compare_ab(Side("a", a), Side("b", b), W, agreement=False)
    assert threading.active_count() == before
    assert machine.steps[-1] == ("b", W.max_tokens)  # B's run went on to its end


def test_two_llama_cpp_engines_in_process_pair_token_by_token(tiny_model_path) -> None:
    a, b = (LlamaCppEngine(tiny_model_path, threads=1, name=n) for n in ("a", "b"))
    try:
        r = compare_ab(Side("a", a), Side("b", b), Workload(prompt_tokens=16, max_tokens=6, runs=4, warmup=1))
    finally:
        a.close()
        b.close()
    assert r.interleaved is Interleaved.TOKEN and r.unstepped is None
    assert "seeded) token by token after 1 warm-up" in r.lines()[2]
    assert r.decode.n_pairs == 4 and r.agreement is not None and r.agreement.kl_mean == 0.0
    assert as_dict(r)["interleaved"] == "token" and ("llmperf.ab.interleaved", "token") in properties([r])


@pytest.mark.parametrize("in_process", [False, True], ids=["worker", "in-process"])
def test_the_marker_form_says_how_its_pairs_took_turns(pytester: pytest.Pytester, in_process: bool) -> None:
    """llama.cpp settings as sides: in the engine workers (the default) whole runs, and the line
    says why and what can; in this process (``--llmperf-in-process``) token by token. The session
    JSON's ``ab`` entry, the JUnit properties, the Markdown summary and the HTML report say it too
    (the last two in the terminal line's words, from the entry)."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.llmperf(a={"threads": 1}, b={"threads": 2}, runs=3, prompt_tokens=16, max_tokens=4)
        def test_sides():
            pass
        """
    )
    flags = ["--llmperf-in-process"] if in_process else []
    reports = ["--llmperf-json", "session.json", "--llmperf-markdown", "s.md", "--llmperf-html", "s.html"]
    result = run(pytester, "-rA", *reports, "--junitxml", "junit.xml", *flags)
    result.assert_outcomes(passed=1)
    turns = (
        "token by token"
        if in_process
        else "run by run (not token by token: side A [threads=1] runs in an engine worker, which cannot pause "
        "between tokens (--llmperf-in-process can))"
    )
    assert "3 pairs interleaved (" in result.stdout.str()
    assert f"seeded) {turns} after " in result.stdout.str()
    entry = json.loads((pytester.path / "session.json").read_text())["ab"][0]
    assert entry["interleaved"] == ("token" if in_process else "run")
    assert (entry["unstepped"] is None) is in_process
    junit = (pytester.path / "junit.xml").read_text()
    assert f'name="llmperf.ab.interleaved" value="{entry["interleaved"]}"' in junit
    said = re.search(
        r"^3 pairs interleaved \(\d AB, \d BA, seeded\) (.*)\.$", (pytester.path / "s.md").read_text(), re.MULTILINE
    )
    assert said is not None and said.group(1) == turns
    page = (pytester.path / "s.html").read_text()
    assert f"BA, seeded) {html.escape(turns)}; A: " in page
    assert ab_section([entry]) in page  # from the session JSON's entry alone


def test_an_older_ab_entry_says_nothing_of_how_its_runs_took_turns() -> None:
    """A session file of before token-by-token A/Bs (no ``interleaved``): its Markdown and HTML
    lines stop at the pairs, claiming neither way; the same entry with each way says it."""
    machine = StepMachine(6)
    r = compare_ab(Side("a", SteppedEngine(machine, "a")), Side("b", WholeEngine(machine, "b")), W, agreement=False)
    entry = {"test": "t.py::test_ab", **json.loads(json.dumps(as_dict(r)))}
    older = {k: v for k, v in entry.items() if k not in ("interleaved", "unstepped")}
    head = f"{W.runs} pairs interleaved ({r.orders.count('AB')} AB, {r.orders.count('BA')} BA, seeded)"
    assert ab_pairs_line(older) == head
    assert f"\n{head}.\n" in "\n".join(ab_markdown_lines([older]))
    assert f"{head}; A: " in ab_section([older])
    assert ab_pairs_line(entry) == f"{head} run by run (not token by token: side B [b] cannot pause between tokens)"
    assert ab_pairs_line({**entry, "interleaved": "token", "unstepped": None}) == f"{head} token by token"
