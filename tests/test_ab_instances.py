"""The in-process A/B's second level (docs/ab.md, "Instances: the second level"): its pairs in
blocks, each later block on a fresh pair of engine instances (``FreshInstances``), built and
closed between blocks, the CIs from the two-level model over the instance pairs; a side that
cannot be built again (a callable) runs every pair on its one instance, which one line says.

Real llama.cpp (the tiny preset); nothing here asserts a time."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from inner import run

from pytest_llmperf import LlamaCppEngine, Workload
from pytest_llmperf.core.workload import RunTrace
from pytest_llmperf.engines.capabilities import FreshInstances
from pytest_llmperf.judge.ab import Side, as_dict, block_size, compare_ab, first_blocks, properties
from pytest_llmperf.judge.paired import FIRST_BLOCK, PAIRS_PER_PROCESS, paired
from pytest_llmperf.measuring.interleave import SoFar

W = Workload(prompt_tokens=16, max_tokens=6, runs=14, warmup=1, seed=3)


class Counting(LlamaCppEngine):
    """llama.cpp in this process that logs each fresh instance it builds and each close."""

    log: ClassVar[list[tuple[str, int]]] = []

    def fresh_instance(self) -> Counting:
        engine = Counting.from_config(self.config, name=self.info().model)
        self.log.append(("built", id(engine)))
        return engine

    def close(self) -> None:
        self.log.append(("closed", id(self)))
        super().close()


@pytest.fixture
def counted(tiny_model_path: Path) -> Iterator[tuple[Counting, Counting]]:
    Counting.log = []
    a, b = Counting(tiny_model_path, threads=1, name="a"), Counting(tiny_model_path, threads=1, name="b")
    yield a, b
    a.close()
    b.close()


def test_llama_cpp_gives_a_fresh_instance_of_its_settings(tiny_engine: LlamaCppEngine) -> None:
    assert isinstance(tiny_engine, FreshInstances)
    other = tiny_engine.fresh_instance()
    try:
        assert other is not tiny_engine and other.llm is not tiny_engine.llm
        assert other.config == tiny_engine.config
        assert len(other.run(Workload(prompt_tokens=8, max_tokens=3), 0).token_ns) == 3
    finally:
        other.close()


def test_two_llama_cpp_sides_run_over_fresh_instance_pairs(counted: tuple[Counting, Counting]) -> None:
    a, b = counted
    r = compare_ab(Side("a", a), Side("b", b), W, agreement=False, attribution=None)
    # Blocks of 4 and 4 (first_blocks), then the 6 left in blocks of 3 or more: 3 or 4 instance pairs.
    k = r.instance_pairs
    assert r.blocks[:2] == (4, 4) and sum(r.blocks) == len(r.orders) == W.runs and len(r.blocks) == k >= 3
    assert all(size >= PAIRS_PER_PROCESS[0] for size in r.blocks)
    built = [i for what, i in Counting.log if what == "built"]
    closed = [i for what, i in Counting.log if what == "closed"]
    assert len(built) == 2 * (k - 1) and sorted(closed) == sorted(built)  # each fresh pair closed
    assert id(a) not in closed and id(b) not in closed  # the given engines are the caller's
    # Each fresh pair was closed before the next was built: at most one alive at a time.
    alive = 0
    for what, _ in Counting.log:
        alive += 1 if what == "built" else -1
        assert alive <= 2
    assert r.build_s > 0 and r.one_instance == ""
    assert {one.metric for one in r.levels} == {c.metric for c in r.comparisons} >= {"ttft_ms", "tpot_ms"}
    assert all(one.process_pairs == k and one.pairs == W.runs for one in r.levels)
    for c in r.comparisons:  # the two-level CI spans the pairs' own signed-rank CI
        own = paired(c.metric, [getattr(x, c.metric) for x in r.a.runs], [getattr(x, c.metric) for x in r.b.runs])
        assert c.ci_low <= own.ci_low and c.ci_high >= own.ci_high and c.p_value >= own.p_value
        assert c.n_pairs == W.runs
    head = [line for line in r.lines() if "instance pairs" in line]
    assert len(head) == 1 and head[0].startswith(f"{k} engine instance pairs (blocks of 4, 4, ")
    levels = [line for line in r.lines(verbose=True) if line.startswith("levels: ")]
    assert len(levels) == len(r.levels) and all(f"between {k} instance pairs sd" in line for line in levels)
    entry = json.loads(json.dumps(as_dict(r)))
    assert (entry["instance_pairs"], entry["blocks"], entry["one_instance"]) == (k, list(r.blocks), "")
    assert entry["build_s"] > 0 and {one["metric"] for one in entry["levels"]} >= {"ttft_ms", "tpot_ms"}
    props = dict(properties([r]))
    assert props["llmperf.ab.instance_pairs"] == k and "llmperf.ab.tpot_ms.between_sd" in props
    assert len(a.run(W, 0).token_ns) == W.max_tokens  # the given engines still run


def test_a_callable_side_runs_on_one_instance_pair_and_says_so(counted: tuple[Counting, Counting]) -> None:
    a, _ = counted
    llm = a.llm
    assert llm is not None

    def fn(prompt: str, max_tokens: int) -> Iterator[object]:
        yield from llm.create_completion(prompt, max_tokens=max_tokens, stream=True)

    r = compare_ab(Side("a", a), Side("fn", fn), W, agreement=False, attribution=None)
    assert r.instance_pairs == 1 and r.blocks == (W.runs,) and r.levels == ()
    assert Counting.log == []  # nothing built, nothing closed
    said = [line for line in r.lines(verbose=True) if "instance pair" in line]
    assert said == [
        "the CI holds one instance pair (no second level): side B [fn] is a callable, which llmperf cannot build again"
    ]
    assert as_dict(r)["one_instance"] == r.one_instance and "llmperf.ab.instance_pairs" not in dict(properties([r]))


def _so_far(groups: tuple[int, ...], runs: int) -> SoFar:
    return SoFar((), (), groups, len(set(groups)) - 1 if groups else 0, 0.0, 0.0, runs)


def test_block_sizes_first_blocks_and_the_rest() -> None:
    low, high = PAIRS_PER_PROCESS
    assert [first_blocks(s) for s in (3, 6, 10, 14, 20, 60)] == [3, 3, 3, 4, 5, FIRST_BLOCK]
    assert block_size(_so_far((), 3)) == 3  # smoke mode's 3 pairs: one block, nothing built
    assert block_size(_so_far((), 4)) == 4  # 3 would leave one pair for a fresh instance pair
    assert block_size(_so_far((), 10)) == block_size(_so_far((0,) * 3, 10)) == 3  # ten pairs: 3, 3, 4
    # Two instance pairs, no levels measurable (no traces): the most, but never leaving 1 or 2.
    assert block_size(_so_far((0,) * 3 + (1,) * 3, 10)) == 4
    assert block_size(_so_far((0,) * 5 + (1,) * 5, 40)) == high
    assert block_size(_so_far((0,) * 3, 8)) == 5  # 3 would leave 2
    assert all(low <= first_blocks(s) <= FIRST_BLOCK for s in range(3, 100))


def test_a_callable_side_in_a_session_says_one_instance_pair_and_v_prints_levels(pytester: pytest.Pytester) -> None:
    """The plugin's own sides (llama.cpp settings) run over fresh instance pairs; ``-v`` prints
    each comparison's levels in the A/B's section and the session JSON keeps them; a callable
    side's A/B says, in one line, that its CI holds one instance pair."""
    pytester.makepyfile(
        """
        import pytest

        def fn(prompt, max_tokens):
            for _ in range(max_tokens):
                yield "x"

        @pytest.mark.llmperf(a={"flash_attn": False}, b={"flash_attn": True}, runs=10, prompt_tokens=16, max_tokens=4)
        def test_settings_sides():
            pass

        @pytest.mark.llmperf(a=fn, b={}, runs=6, prompt_tokens=16, max_tokens=4)
        def test_callable_side():
            pass
        """
    )
    result = run(pytester, "-rA", "-v", "--llmperf-json", "session.json")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "Traceback" not in out
    assert re.search(
        r"^3 engine instance pairs \(blocks of 3, 3, 4 pairs, each block after the first", out, re.MULTILINE
    )
    assert re.search(r"^levels: decode TPOT: between 3 instance pairs sd \d", out, re.MULTILINE)
    one = r"^the CI holds one instance pair \(no second level\): side A \[fn\] is a callable, which llmperf cannot build again$"
    assert len(re.findall(one, out, re.MULTILINE)) == 1
    ab = {e["test"].split("::")[1]: e for e in json.loads((pytester.path / "session.json").read_text())["ab"]}
    settings, callable_ = ab["test_settings_sides"], ab["test_callable_side"]
    assert (settings["instance_pairs"], settings["blocks"]) == (3, [3, 3, 4]) and settings["build_s"] > 0
    assert {one["metric"] for one in settings["levels"]} >= {"ttft_ms", "tpot_ms"}
    assert all(one["process_pairs"] == 3 for one in settings["levels"])
    assert (callable_["instance_pairs"], callable_["levels"]) == (1, [])
    assert "is a callable" in callable_["one_instance"]
    assert np.isfinite([c["ratio"] for c in settings["comparisons"]]).all()


class Placed(LlamaCppEngine):
    """llama.cpp in this process that notes the CPUs its runs' threads may use."""

    cpus: ClassVar[list[frozenset[int]]] = []

    def fresh_instance(self) -> Placed:
        return Placed.from_config(self.config, name=self.info().model)

    def run_stepped(self, workload: Workload, run_index: int, pause) -> RunTrace:
        Placed.cpus.append(frozenset(os.sched_getaffinity(0)))  # the stepped run's own thread
        return super().run_stepped(workload, run_index, pause)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_both_engines_run_on_the_same_cpus_and_the_process_gets_its_own_back(tiny_model_path: Path) -> None:
    """As ``--llmperf-against`` puts both sides' processes on the same idlest CPUs, an in-process
    A/B puts both engines' threads there for its pairs (``measuring.interleave.same_cpus``): every
    run of both sides, on every instance pair, on the same CPUs, as many as the engines' threads
    (1 here, where the machine has more); after the A/B this process may use what it had."""
    before = os.sched_getaffinity(0)
    Placed.cpus = []
    a, b = Placed(tiny_model_path, threads=1, name="a"), Placed(tiny_model_path, threads=1, name="b")
    try:
        r = compare_ab(Side("a", a), Side("b", b), W, agreement=False, attribution=None)
    finally:
        a.close()
        b.close()
    assert r.instance_pairs >= 2 and len(Placed.cpus) == 2 * (W.runs + W.warmup * r.instance_pairs)
    assert len(set(Placed.cpus)) == 1  # one placement for every run of both sides
    assert len(Placed.cpus[0]) == 1 and Placed.cpus[0] <= before
    assert os.sched_getaffinity(0) == before
