"""Sequential (adaptive) run count: more runs only while the baseline verdict is undecided."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_llmperf.session import results as pipeline
from pytest_llmperf.session.options import validate
from pytest_llmperf.session.results import Measurer


def tokens(prompt: str, max_tokens: int):
    yield from range(max_tokens)


def verdicts(*words: str):
    """An assessment whose comparison verdicts are ``words``."""
    comps = tuple(SimpleNamespace(verdict=SimpleNamespace(value=w), worth_more_runs=w == "INCONCLUSIVE") for w in words)
    return SimpleNamespace(verdict=SimpleNamespace(status="compared", comparisons=comps, machine=""))


def test_measures_more_while_inconclusive_up_to_max_runs() -> None:
    seen = []

    def assess(m, config):
        seen.append((m.n_runs, config.settings["looks"]))
        return verdicts("UNCHANGED", "INCONCLUSIVE")

    perf = Measurer(
        validate({"runs": 4, "warmup": 0, "max_tokens": 3, "prompt": "x", "max_runs": 10}), lambda: None, assess
    )
    m = perf.measure(tokens).measurement
    assert seen == [(4, 3), (8, 3), (10, 3)] and m.n_runs == 10
    assert perf.results[0].measurement.n_runs == 10 and len(m.runs) == 10


def test_stops_at_the_first_decided_look() -> None:
    answers = iter([verdicts("INCONCLUSIVE"), verdicts("REGRESSION"), verdicts("INCONCLUSIVE")])
    runs = []

    def assess(m, config):
        runs.append(m.n_runs)
        return next(answers)

    Measurer(validate({"runs": 5, "warmup": 0, "max_tokens": 3, "prompt": "x"}), lambda: None, assess).measure(tokens)
    assert runs == [5, 10]


def test_off_without_a_comparison_or_with_max_runs_equal_to_runs(monkeypatch) -> None:
    runs = []

    def assess(m, config):
        runs.append((m.n_runs, config.settings["looks"]))
        return verdicts("INCONCLUSIVE")

    Measurer(
        validate({"runs": 3, "warmup": 0, "max_tokens": 3, "prompt": "x", "max_runs": 3}), lambda: None, assess
    ).measure(tokens)
    assert runs == [(3, 1)]
    calls = []
    Measurer(
        validate({"runs": 3, "warmup": 0, "max_tokens": 3, "prompt": "x"}),
        lambda: None,
        lambda m, c: calls.append(m.n_runs),
    ).measure(tokens)
    assert calls == [3]  # no baseline verdict (None): nothing to decide
    monkeypatch.setattr(pipeline, "SEQUENTIAL_TIME_CAP_S", 0.0)
    runs.clear()
    Measurer(validate({"runs": 3, "warmup": 0, "max_tokens": 3, "prompt": "x"}), lambda: None, assess).measure(tokens)
    assert runs == [(3, 3)]  # the time cap stops it
