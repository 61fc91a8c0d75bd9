"""The in-process A/B token by token against whole runs, on real llama.cpp (issue 50 point 4).

Per session (one ``compare_ab`` of two in-process llama.cpp engines of the same model, 1 thread
each, synthetic prompt, ``--pairs`` pairs after 1 warm-up each), for each case and each way of
taking turns, alternately in the same run (so the machine's load falls on both ways alike):

- cases: ``aa`` (B identical to A), ``+2%`` and ``+8%`` (B spends that share of the time
  llama.cpp took for each generated token after the first on extra work, a spin on the clock
  right after llama.cpp's step: decode work, not prefill, as ``against_sessions.py``'s wrapper);
- ways: ``token`` (both engines pause between tokens: each pair's runs take turns step by step)
  and ``run`` (the same engines behind a wrapper without ``SteppedRuns``: whole runs).

Printed per case and way: how many sessions' decode and TTFT 95% CIs cover 1 (A/A) or lie
above 1, the REGRESSION count and median pairs and seconds per decision under
``--llmperf-against``'s rule (``judge.paired.judged_pairs`` at the 5% threshold, a look every 10
pairs, ``pairs_settled``; replayed on the session's pairs, a session that no look settles counts
as all its pairs), and the median sd of a pair's decode log ratio.

    .venv/bin/python benchmarks/ab_token_sessions.py --sessions 2 --pairs 20       # ~6 min here
    .venv/bin/python benchmarks/ab_token_sessions.py --sessions 20 --pairs 60      # the full run
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from pytest_llmperf import Workload, ensure_model
from pytest_llmperf.core.settings import DEFAULT_ALPHA, DEFAULT_TAIL_THRESHOLD, DEFAULT_THRESHOLD
from pytest_llmperf.core.workload import EngineInfo, RunTrace
from pytest_llmperf.engines.llama_cpp import LlamaCppEngine
from pytest_llmperf.judge.ab import ABResult, Side, compare_ab
from pytest_llmperf.judge.paired import judged_pairs, pairs_settled
from pytest_llmperf.judge.verdict import Verdict

LOOK_EVERY = 10
LOOKS = 6  # against's default plan: a look every 10 pairs up to 60


class SlowerDecode:
    """llama.cpp's module with ``extra`` x each one-token step's own time spent after it (a spin:
    the step's clock read comes after it). The prompt's batches are untouched."""

    def __init__(self, lib: ModuleType, extra: float) -> None:
        self._lib, self._extra = lib, extra

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def llama_decode(self, ctx: Any, batch: Any) -> int:
        began = time.perf_counter()
        rc = int(self._lib.llama_decode(ctx, batch))
        if batch.n_tokens == 1:
            self._lib.llama_synchronize(ctx)
            end = time.perf_counter() + self._extra * (time.perf_counter() - began)
            while time.perf_counter() < end:
                pass
        return rc


class WholeRuns:
    """An engine's ``run`` and ``info`` only: no ``SteppedRuns``, so an A/B takes whole runs."""

    def __init__(self, engine: LlamaCppEngine) -> None:
        self.engine = engine

    def info(self) -> EngineInfo:
        return self.engine.info()

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        return self.engine.run(workload, run_index)


@dataclass
class Row:
    case: str
    way: str
    decode: tuple[float, float, float]
    ttft: tuple[float, float, float]
    verdict: str
    pairs: int
    seconds: float
    spread: float


def decided(r: ABResult) -> tuple[str, int]:
    """The verdict (REGRESSION if any judged metric's, else decode TPOT's) and the pairs
    ``--llmperf-against``'s rule would have stopped at ("(unsettled)": no look settled)."""
    n_all = len(r.a.runs)
    for n in range(LOOK_EVERY, n_all + 1, LOOK_EVERY):
        got = judged_pairs(
            r.a.runs[:n],
            r.b.runs[:n],
            alpha=DEFAULT_ALPHA,
            threshold=DEFAULT_THRESHOLD,
            tail_threshold=DEFAULT_TAIL_THRESHOLD,
            family=1,
            looks=LOOKS,
        )
        if pairs_settled(got) is not None or n + LOOK_EVERY > n_all:
            judged = {c.metric: c.verdict for c in got if c.mirror_of is None}
            verdict = Verdict.REGRESSION if Verdict.REGRESSION in judged.values() else judged["tpot_ms"]
            settled = pairs_settled(got) is not None
            return (verdict.value if settled else f"{verdict.value} (unsettled)"), n
    return "none", n_all


def session(a: Any, b: Any, case: str, way: str, workload: Workload) -> Row:
    started = time.monotonic()
    r = compare_ab(Side("a", a), Side(case, b), workload, agreement=False, attribution=None)
    per_pair = (time.monotonic() - started) / (workload.runs + workload.warmup)
    assert r.interleaved.value == way, (r.interleaved, r.unstepped)
    verdict, n = decided(r)
    d = np.log([x.tpot_ms for x in r.b.runs]) - np.log([x.tpot_ms for x in r.a.runs])
    c, t = r.decode, r.prefill
    return Row(
        case,
        way,
        (c.ratio, c.ci_low, c.ci_high),
        (t.ratio, t.ci_low, t.ci_high),
        verdict,
        n,
        n * per_pair,
        float(np.std(d, ddof=1)),
    )


def summary(rows: list[Row], case: str, way: str) -> str:
    mine = [x for x in rows if x.case == case and x.way == way]
    k = len(mine)
    covers = sum(1 for x in mine if x.decode[1] <= 1.0 <= x.decode[2])
    above = sum(1 for x in mine if x.decode[1] > 1.0)
    ttft_covers = sum(1 for x in mine if x.ttft[1] <= 1.0 <= x.ttft[2])
    regressions = sum(1 for x in mine if x.verdict.startswith("REGRESSION"))
    return (
        f"{case:>4} {way:>5}: decode CI covers 1 {covers}/{k}, above 1 {above}/{k}; TTFT CI covers 1 "
        f"{ttft_covers}/{k}; REGRESSION {regressions}/{k}; median {statistics.median(x.pairs for x in mine):.0f} "
        f"pairs, {statistics.median(x.seconds for x in mine):.1f} s per decision; decode pair sd "
        f"{statistics.median(x.spread for x in mine):.1%}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=2, help="sessions per case and way")
    p.add_argument("--pairs", type=int, default=20, help="pairs per session (the rule's looks replayed on them)")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--preset", default="small")
    p.add_argument("--cases", default="aa,+2%,+8%")
    args = p.parse_args()

    path = ensure_model(args.preset)
    a = LlamaCppEngine(path, threads=1, name="a")
    cases = [c.strip() for c in args.cases.split(",")]
    bs: dict[str, LlamaCppEngine] = {}
    for case in cases:
        bs[case] = LlamaCppEngine(path, threads=1, name=case)
        if case != "aa":
            bs[case]._lib = SlowerDecode(bs[case]._lib, float(case.strip("+%")) / 100.0)  # type: ignore[assignment]
    rows: list[Row] = []
    for s in range(args.sessions):
        for case in cases:
            for way in ("token", "run"):
                w = Workload(
                    prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, runs=args.pairs, warmup=1, seed=s
                )
                sa, sb = (a, bs[case]) if way == "token" else (WholeRuns(a), WholeRuns(bs[case]))
                row = session(sa, sb, case, way, w)
                rows.append(row)
                print(
                    f"session {s} {case:>4} {way:>5}: decode x{row.decode[0]:.3f} ({row.decode[1]:.3f}..{row.decode[2]:.3f}) "
                    f"TTFT x{row.ttft[0]:.3f} ({row.ttft[1]:.3f}..{row.ttft[2]:.3f}) {row.verdict} at {row.pairs} pairs "
                    f"({row.seconds:.1f} s); pair sd {row.spread:.1%}",
                    flush=True,
                )
    print()
    for case in cases:
        for way in ("token", "run"):
            print(summary(rows, case, way))
    print(
        f"\n{args.preset} preset, {args.prompt_tokens} + {args.max_tokens} tokens, {args.pairs} pairs a session, "
        f"{args.sessions} session(s) a case and way; full run: .venv/bin/python benchmarks/ab_token_sessions.py "
        "--sessions 20 --pairs 60"
    )
    return 0 if all(math.isfinite(x.decode[0]) for x in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
