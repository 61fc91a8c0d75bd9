"""A busy machine explains a slowdown only as far as it slowed llama.cpp's own evaluation: a
part of the phase around it (the user's code outside llama.cpp, their logits processors, a
grammar's sampling) that rose beyond that keeps the REGRESSION (``parts.beyond_the_machine``).

The figures are those of a streaming wrapper around ``llmperf_llm`` (tiny preset, threads 2 on
2 cores) with one spinning process beside it, against a baseline recorded on the idle machine:
llama.cpp's eval x2.6-26, the code outside it x1.5-3.4 when the wrapper was unchanged, and
+1.0 ms/token when it spun 1 ms per token (seeded, so the counts are fixed)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge.regression import CompareSettings, judge
from pytest_llmperf.judge.verdict import Verdict

WORKLOAD = {"prompt": None, "prompt_tokens": 36, "max_tokens": 24, "seed": 0, "concurrency": 1, "rate": None}
QUIET = {"cpu_wait_share": 0.003, "others_cpu_share": 0.0, "steal_share": 0.0, "involuntary_switches_per_run": 0.3}
BUSY = {"cpu_wait_share": 0.36, "others_cpu_share": 0.36, "steal_share": 0.0, "involuntary_switches_per_run": 25.0}
RUNS = 10


def _runs(rng: np.random.Generator, ms: float, cv: float) -> np.ndarray:
    return ms * np.exp(rng.normal(0.0, cv, RUNS))


def record(rng: np.random.Generator, machine: dict, *, eval_x: float = 1.0, cv: float = 0.03, **decode: float) -> dict:
    """A record of RUNS runs: prefill (tokenization, llama.cpp prompt eval, outside) and decode
    (llama.cpp eval, its sampling, the Python logits processors, outside) per run, each decode
    part's baseline median times ``eval_x`` (llama.cpp's) or as given in ``decode`` (ms/token)."""
    prefill = {
        "tokenize_ms": _runs(rng, 0.05, cv),
        "native_prefill_ms": _runs(rng, 1.1 * eval_x, cv),
        "prefill_outside_ms": _runs(rng, 0.11, cv),
    }
    parts = {
        "native_decode_ms_per_token": _runs(rng, 0.15 * eval_x, cv),
        "sampling_ms_per_token": _runs(rng, decode.get("sampling", 0.006), cv),
        "python_sampling_ms_per_token": _runs(rng, decode.get("python", 0.001), cv),
        "decode_outside_ms_per_token": _runs(rng, decode.get("outside", 0.024), cv),
    }
    ttft = sum(prefill.values())
    tpot = sum(parts.values())
    return {
        "workload": WORKLOAD,
        "subject": {},
        "hardware": {},
        "runs": {
            "ttft_ms": list(ttft),
            "prefill_tps": list(36_000.0 / ttft),
            "tpot_ms": list(tpot),
            "decode_tps": list(1000.0 / tpot),
        },
        "parts": {k: list(v) for k, v in {**prefill, **parts}.items()},
        "machine": machine,
    }


def _judged(candidate: dict, seed: int = 5):
    base = record(np.random.default_rng(seed), QUIET)
    return judge({"hw": Measurement.read(base)}, "hw", Measurement.read(candidate), CompareSettings())


@pytest.mark.parametrize(
    ("part", "decode", "said"),
    [
        ("outside llama.cpp", {"outside": 1.1}, "outside llama.cpp +1.0"),  # the wrapper spins 1 ms a token
        ("logits processors", {"python": 0.6}, "logits processors / stopping criteria (Python) +0.6"),
        ("a grammar", {"sampling": 0.9}, "sampling (llama.cpp) x"),  # llama.cpp's, on one thread
    ],
)
def test_a_part_around_llama_cpps_eval_that_rose_beyond_the_busy_machine_keeps_the_regression(
    part: str, decode: dict, said: str
) -> None:
    v = _judged(record(np.random.default_rng(11), BUSY, eval_x=3.0, cv=0.08, **decode))
    by_phase = {c.phase: c.verdict for c in v.comparisons if c.mirror_of is None and c.metric != "itl_p95_ms"}
    assert by_phase == {"prefill": Verdict.MACHINE_SLOWER, "decode": Verdict.REGRESSION}, (part, by_phase)
    assert v.machine.startswith("busy machine: ")  # the signals are still named
    line = next(n for n in v.note.split("; ") if n.startswith("decode TPOT REGRESSION on a busy machine: "))
    assert said in line and "is more than the machine explains: it slowed llama.cpp eval x" in line, line


@pytest.mark.parametrize("seed", range(6))
def test_the_code_around_llama_cpp_slowed_less_than_its_eval_is_the_busy_machines(seed: int) -> None:
    """An unchanged wrapper on a busy machine (eval x2.6-5.5, outside x1.5-3.4 as measured):
    every slowdown is MACHINE_SLOWER, none a REGRESSION, and no note keeps one."""
    rng = np.random.default_rng(100 + seed)
    eval_x = float(rng.uniform(2.6, 5.5))
    outside = 0.024 * eval_x * float(rng.uniform(0.4, 0.65))
    v = _judged(record(rng, BUSY, eval_x=eval_x, cv=0.15, outside=outside), seed=seed)
    assert not v.regressions and v.short == "MACHINE_SLOWER", (eval_x, outside, v.short)
    assert "on a busy machine" not in v.note


def test_without_llama_cpps_own_counters_a_busy_machine_takes_the_whole_slowdown() -> None:
    """No llama.cpp eval to gauge the machine by (a callable that drives no Llama, a server
    without timings): every REGRESSION is MACHINE_SLOWER, as the signals say."""
    candidate = record(np.random.default_rng(12), BUSY, eval_x=3.0, outside=1.1)
    for rec in (candidate,):
        for name in ("native_prefill_ms", "native_decode_ms_per_token"):
            del rec["parts"][name]
    v = _judged(candidate)
    assert not v.regressions and v.short == "MACHINE_SLOWER"


def test_on_an_idle_machine_the_rule_changes_nothing() -> None:
    v = _judged(record(np.random.default_rng(13), QUIET, outside=1.1))
    assert v.regressions and "busy machine" not in v.note and not v.machine
