"""Session-wide steps over the typed results (``judge.result``), once every result is in:
Holm over all the session's comparisons, and the suite-relative check. Each returns new
results (they are frozen), never edits them in place."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .suite import suite_relative
from .verdict import Comparison, Verdict, holm
from .regression import CompareSettings, blame_machine
from .result import MeasurementResult


def _with_comparisons(r: MeasurementResult, comparisons: Sequence[Comparison], **verdict: object) -> MeasurementResult:
    assert r.verdict is not None
    return dataclasses.replace(r, verdict=dataclasses.replace(r.verdict, comparisons=tuple(comparisons), **verdict))


def session_holm(results: Sequence[MeasurementResult]) -> list[MeasurementResult]:
    """The results with Holm over every judged comparison of the finished session, so the
    "p (Holm)" reported equals Holm over all the session's p-values. Verdicts stay as decided
    during the session: each was decided against an upper bound of this adjustment (unseen
    comparisons counted as p = 1). A mirror (a rate of the same runs) takes its metric's."""
    judged = [
        (i, j, c)
        for i, r in enumerate(results) if r.verdict is not None
        for j, c in enumerate(r.verdict.comparisons)
        if c.mirror_of is None and c.p_value is not None
    ]
    if not judged:
        return list(results)
    worse = holm([c.p_value for _, _, c in judged])
    better = holm([c.p_value_better if c.p_value_better is not None else 1.0 for _, _, c in judged])
    adjusted = {(i, j): (pw, pb) for (i, j, _), pw, pb in zip(judged, worse, better)}
    out = []
    for i, r in enumerate(results):
        if r.verdict is None or not r.verdict.comparisons:
            out.append(r)
            continue
        comps = [
            dataclasses.replace(c, p_adjusted=adjusted[i, j][0], p_adjusted_better=adjusted[i, j][1])
            if (i, j) in adjusted else c
            for j, c in enumerate(r.verdict.comparisons)
        ]
        by_metric = {c.metric: c for c in comps if c.mirror_of is None}
        comps = [
            dataclasses.replace(c, p_adjusted=by_metric[c.mirror_of].p_adjusted,
                                p_adjusted_better=by_metric[c.mirror_of].p_adjusted_better)
            if c.mirror_of in by_metric else c
            for c in comps
        ]
        out.append(_with_comparisons(r, comps))
    return out


def suite_check(
    results: Sequence[MeasurementResult], settings: CompareSettings
) -> tuple[list[MeasurementResult], list[str]]:
    """The session-end suite-relative check (``suite.suite_relative``): the results with
    their new verdicts, and the failure line of each new REGRESSION."""
    results = list(results)
    if not settings.suite_check:
        return results, []
    compared = [i for i, r in enumerate(results) if r.verdict is not None and r.verdict.status == "compared"]
    before = [list(results[i].verdict.comparisons) for i in compared]  # type: ignore[union-attr]
    after = suite_relative(before, alpha=settings.alpha_suite)
    lines = []
    for i, old, new in zip(compared, before, after):
        if old == new:
            continue
        r = results[i]
        v = r.verdict
        assert v is not None
        new = blame_machine(new, v.machine or None)  # a busy machine during this test's runs
        suffix = f"; {', '.join(v.changes)}" if v.changes else ""
        fresh = [c.line() + suffix for o, c in zip(old, new)
                 if c.verdict is Verdict.REGRESSION and o.verdict is not Verdict.REGRESSION and c.mirror_of is None]
        phases = sorted({c.phase for c in new if c.verdict is Verdict.REGRESSION})
        results[i] = _with_comparisons(
            r, new, failures=v.failures + tuple(fresh),
            short="REGRESSION " + "+".join(phases) if phases else Verdict.MACHINE_SLOWER.value,
        )
        lines += [f"{r.test or '?'}: {line}" for line in fresh]
    return results, lines
