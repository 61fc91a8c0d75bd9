"""Values that cannot be what they are given for, refused where they are given, in one line
that writes the number readably: every numeric marker key (a budget, a count, a rate, a
share...), every numeric setting (option, environment, ini, ``llmperf`` flag) and the
relative and agreement budgets of an A/B. Parametrized over the schema (``session.options.KEYS``,
``core.settings.SETTINGS``) so a key added later is covered."""

from __future__ import annotations

import math
import re

import pytest

from pytest_llmperf.core.errors import ConfigError
from pytest_llmperf.core.formats import fmt, shown
from pytest_llmperf.core.settings import SETTINGS
from pytest_llmperf.session.options import KEYS, validate

#: Numbers no budget, count, rate, share or wait can be.
HOSTILE = (math.inf, -math.inf, math.nan, 1e308, 10**400, -(10**400))
#: A run of this many digits is a number nobody reads.
LONG_NUMBER = re.compile(r"\d{20}")


def _takes_a_number(check, samples) -> bool:
    for sample in samples:
        try:
            check(sample)
        except (ConfigError, ValueError):
            continue
        return True
    return False


NUMERIC_KEYS = [
    name
    for name, key in KEYS.items()
    if key.kind != "ab" or name in ("max_slowdown", "min_speedup") or name.startswith(("max_kl", "min_top1"))
    if _takes_a_number(lambda v, name=name: validate({name: v}, together=False), (1, 0.5, 2))
]
NUMERIC_SETTINGS = [
    name
    for name, s in SETTINGS.items()
    if not s.switch and _takes_a_number(s.parse, ("1", "0.5", "2")) and not _takes_a_number(s.parse, ("many",))
]


def test_the_schema_has_numeric_keys_and_settings() -> None:
    """The parametrization below is not empty: budgets, counts, rates, timeouts are in it."""
    assert {"min_tps", "p95_ms", "runs", "rate", "min_goodput", "max_kl", "min_speedup", "max_runs"} <= set(
        NUMERIC_KEYS
    )
    assert {"engine_timeout", "threads", "alpha", "peak_bw"} <= set(NUMERIC_SETTINGS)


@pytest.mark.parametrize("name", NUMERIC_KEYS)
@pytest.mark.parametrize("value", HOSTILE, ids=shown)
def test_a_marker_key_refuses_a_number_it_cannot_be_in_one_readable_line(name, value) -> None:
    with pytest.raises(ConfigError) as caught:
        validate({name: value})
    line = str(caught.value)
    assert "\n" not in line and name in line, line
    assert not LONG_NUMBER.search(line), line
    assert len(line) < 200, line


@pytest.mark.parametrize("name", ["max_slowdown", "min_speedup"])
@pytest.mark.parametrize("value", HOSTILE, ids=shown)
def test_a_relative_budget_per_phase_refuses_it_too(name, value) -> None:
    with pytest.raises(ConfigError) as caught:
        validate({name: {"decode": value}})
    assert not LONG_NUMBER.search(str(caught.value)) and "\n" not in str(caught.value)


@pytest.mark.parametrize("name", NUMERIC_SETTINGS)
@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e308", "1" + "0" * 400])
def test_a_setting_refuses_a_number_it_cannot_be_in_one_readable_line(name, text) -> None:
    with pytest.raises(ValueError) as caught:
        SETTINGS[name].parse(text)
    line = str(caught.value)
    assert "\n" not in line and not LONG_NUMBER.search(line), line


@pytest.mark.parametrize("value", [1e308, 12345678901.0, -1e300, math.inf, 10**30])
def test_a_figure_is_written_readably(value) -> None:
    """``fmt`` (every figure a report prints) and ``shown`` (every value a message quotes)."""
    for text in (fmt(value), shown(value)):
        assert not LONG_NUMBER.search(text) and len(text) <= 12, text
    assert fmt(1e308) == "1e+308" and shown(1e308) == "1e+308"


# Contradictory settings: each contradiction one line, at collection (marker) or at start (options).

CONTRADICTORY = {
    "_max_runs_below_runs": ({"runs": 5, "max_runs": 4}, "max_runs 4 is below runs 5"),
    "_requests_below_concurrency": ({"concurrency": 8, "requests": 4}, "concurrency 8 is above the 4 requests"),
    "_context_below_workload": ({"prompt_tokens": 100, "max_tokens": 64, "n_ctx": 128}, "n_ctx 128 is below"),
    "_ubatch_above_batch": ({"n_batch": 64, "n_ubatch": 128}, "n_ubatch 128 is above n_batch 64"),
    "_quantized_v_without_flash_attn": ({"type_v": "q8_0", "flash_attn": False}, "needs flash_attn=True"),
    "_conversation_alone": (
        {"conversation": ["Hi.", "Why?"], "rate": 2.0},
        "a conversation with rate is not supported",
    ),
}


def test_every_contradiction_rule_has_a_case() -> None:
    from pytest_llmperf.session.options import CONTRADICTIONS

    assert {rule.__name__ for rule in CONTRADICTIONS} == set(CONTRADICTORY)


@pytest.mark.parametrize("rule", sorted(CONTRADICTORY))
def test_contradictory_marker_keys_are_refused_in_one_line(rule) -> None:
    given, words = CONTRADICTORY[rule]
    with pytest.raises(ConfigError) as caught:
        validate(given)
    assert str(caught.value).startswith("llmperf marker: ") and words in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "given",
    [
        {"runs": 5, "max_runs": 5},  # = runs: measures no more
        {"concurrency": 4, "requests": 4},
        {"prompt_tokens": 64, "max_tokens": 64, "n_ctx": 128},
        {"n_batch": 128, "n_ubatch": 128},
        {"type_v": "q8_0", "flash_attn": True},
        {"type_v": "q8_0"},  # flash_attn may come from the session
    ],
)
def test_keys_that_agree_are_taken(given) -> None:
    validate(given)


def test_max_runs_below_the_default_runs_is_refused_and_a_later_override_is_checked_with_the_marker() -> None:
    with pytest.raises(ConfigError, match=r"max_runs 5 is below runs 20 "):
        validate({"max_runs": 5})
    marker = validate({"runs": 4, "max_runs": 8})
    with pytest.raises(ConfigError, match=r"max_runs 8 is below runs 10 "):
        marker.merged({"runs": 10})  # llmperf.measure(runs=10) under the marker


def test_a_shared_prefix_as_long_as_the_prompt_is_refused_at_collection() -> None:
    with pytest.raises(ConfigError, match=r"^llmperf marker: shared_prefix_tokens must be between 1 and"):
        validate({"prompt_tokens": 10, "shared_prefix_tokens": 10})


def test_a_token_timeout_longer_than_the_request_timeout_is_refused_when_both_are_given(tmp_path) -> None:
    from pytest_llmperf.session.options import SessionSettings

    with pytest.raises(ConfigError, match=r"token-timeout 100 s is longer than --llmperf-request-timeout 10 s"):
        SessionSettings.of(tmp_path, token_timeout=100, request_timeout=10)
    assert SessionSettings.of(tmp_path, token_timeout=100).engine.token_timeout == 100  # the default gives way


# Given twice: never silently last-wins.


@pytest.mark.parametrize(
    "args, conflict",
    [
        (
            ["--llmperf-threads", "2", "--llmperf-threads=4"],
            "--llmperf-threads is given twice ('2' and '4'): the last one, '4', counts",
        ),
        (["--llmperf-threshold=5%", "x.py", "--llmperf-threshold", "0.1"], "--llmperf-threshold is given twice"),
        (["--llmperf-model", "tiny", "--llmperf-model", "small"], "--llmperf-model is given twice"),
        (["--llmperf-threshold=5%", "--llmperf-threshold", "0.05"], None),  # the same value twice
        (["--llmperf-threads", "2", "--", "--llmperf-threads", "4"], None),  # after --: not options
        (["--llmperf-json", "a.json", "--llmperf-markdown", "a.json"], None),  # two settings
    ],
)
def test_an_option_given_twice_with_different_values_is_named(args, conflict) -> None:
    from pytest_llmperf.core.settings import conflicting_option

    line = conflicting_option(args)
    assert (line is None) if conflict is None else (conflict in line and "\n" not in line), line


def test_a_command_flag_given_twice_is_named_and_the_last_counts(capsys: pytest.CaptureFixture) -> None:
    """A CI script that appends an override to its defaults: the last value counts, as argparse
    reads it, and one line names both (never silently last-wins)."""
    from pytest_llmperf import cli

    assert cli.main(["profile", "/nonexistent/m.gguf", "--threads", "1", "--threads", "2", "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "llmperf: warning: --threads is given twice ('1' and '2'): the last one, '2', counts; give it once"
    assert len(err) == 2 and err[1].startswith("llmperf: error:"), err


def test_an_option_given_twice_is_named_once_in_the_header(pytester: pytest.Pytester) -> None:
    from inner import run

    pytester.makepyfile("def test_plain(): pass")
    result = run(pytester, "--llmperf-threads=1", "--llmperf-threads=2")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    line = "llmperf: warning: --llmperf-threads is given twice ('1' and '2'): the last one, '2', counts; give it once"
    assert result.stdout.str().count(line) == 1, result.stdout.str()


MARKED_TWICE = """
import pytest

@pytest.mark.llmperf(runs=3, max_runs=3)
@pytest.mark.llmperf(runs=5)
def test_twice(): pass

@pytest.mark.llmperf(runs=3)
@pytest.mark.llmperf(runs=3, warmup=0)
def test_same_value_twice(): pass

@pytest.mark.llmperf(max_runs=4)
class TestOverride:
    @pytest.mark.llmperf(runs=4)
    def test_closer_wins(self): pass

@pytest.mark.llmperf(runs=3, warmup=0)
@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.llmperf(runs=4, max_runs=4)), 2])
def test_param_marks_are_closer(n): pass

@pytest.mark.llmperf(min_tps=float("inf"), runs=3)
def test_infinite_floor(): pass

@pytest.mark.llmperf(runs=5, max_runs=4)
def test_contradiction(): pass
"""


def test_stacked_markers_giving_a_key_twice_and_bad_values_fail_collection_in_one_line_each(
    pytester: pytest.Pytester,
) -> None:
    from inner import run

    pytester.makepyfile(test_marked=MARKED_TWICE)
    result = run(pytester, "--collect-only", "-q")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert (
        "test_marked.py::test_twice: llmperf marker key 'runs' is given twice on test_marked.py::test_twice (5 and 3)"
    ) in out
    assert "test_infinite_floor: llmperf marker key 'min_tps' must be > 0 and at most 1e+12, got inf" in out
    assert "test_contradiction: llmperf marker: max_runs 4 is below runs 5" in out
    for fine in ("test_same_value_twice", "test_closer_wins", "test_param_marks_are_closer"):
        assert f"{fine}:" not in out, out
