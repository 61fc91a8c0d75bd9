"""One parser and checker per value kind (``core.values``): an option's text and a marker's
Python value go through the same rule, so what one door takes the other takes too, with the
same bounds, and every refusal is one line."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pytest_llmperf.core import values
from pytest_llmperf.core.errors import did_you_mean
from pytest_llmperf.core.settings import CACHE_TYPES, VALUE_KINDS
from pytest_llmperf.core.workload import MAX_TOKENS

KINDS = {
    **{f"VALUE_KINDS[{k!r}]": kind for k, kind in VALUE_KINDS.items()},
    **{name: getattr(values, name) for name in ("POSITIVE", "SECONDS", "THRESHOLD", "LEVEL", "SHARE")},
}
INTEGERS = {"COUNT": values.COUNT, "TOKENS": values.TOKENS, "GPU_LAYERS": values.GPU_LAYERS, "0": values.Integer(0)}


def _outcome(call, arg):
    """(True, value) or (False, the one-line message)."""
    try:
        return True, call(arg)
    except ValueError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)
        return False, str(exc)


@given(st.sampled_from(list(KINDS)), st.one_of(st.text(max_size=12), st.integers(), st.floats(), st.booleans()))
def test_a_parsed_value_passes_the_check_unchanged(name, given_value) -> None:
    """Whatever the text door takes, the value door takes as it is (a value read from an option
    and one written in a marker are the same value); both refuse in one line."""
    kind = KINDS[name]
    ok, parsed = _outcome(kind.parse, str(given_value))
    if ok:
        assert _outcome(kind.check, parsed) == (True, parsed), (name, given_value)
    _outcome(kind.check, given_value)  # a refusal is one line whatever the value


@given(st.sampled_from(list(INTEGERS)), st.integers(min_value=-(2**40), max_value=2**40))
@example("COUNT", 0)  # the bounds
@example("COUNT", values.MAX_COUNT + 1)
@example("TOKENS", MAX_TOKENS + 1)
@example("GPU_LAYERS", -2)
def test_an_integer_kind_takes_the_same_integers_from_text_and_from_a_value(name, n) -> None:
    kind = INTEGERS[name]
    from_text, from_value = _outcome(kind.parse, f" {n} "), _outcome(kind.check, n)
    assert from_text[0] == from_value[0] == (kind.low <= n <= kind.high), (name, n)
    if from_text[0]:
        assert from_text[1] == from_value[1] == n
    elif n > kind.high and kind.high == MAX_TOKENS:
        assert from_text[1] == from_value[1] == f"must be <= {MAX_TOKENS} (more than any model's context), got {n}"
    elif n > kind.high:
        assert from_text[1] == from_value[1] == f"must be <= {values.MAX_COUNT}, got {n}"
    elif not kind.meaning:  # below the floor: the same line from either door
        assert from_text[1] == from_value[1] == f"must be >= {kind.low}, got {n}"


@given(st.sampled_from(list(INTEGERS)), st.one_of(st.booleans(), st.floats(), st.text(max_size=6)))
def test_an_integer_kind_takes_no_other_python_value(name, value) -> None:
    ok, message = _outcome(INTEGERS[name].check, value)
    assert not ok and message.startswith(f"must be {INTEGERS[name].expected}, got "), (value, message)


@given(st.floats(allow_nan=True, allow_infinity=True))
@example(0.0)
@example(math.inf)  # a floor no run meets, a wait without a deadline
@example(1e308)  # no budget, printed readably (not 309 digits)
@example(values.MAX_NUMBER)
@example(values.MAX_SECONDS * 1.5)
def test_a_positive_number_is_the_same_from_text_and_from_a_value(x) -> None:
    for kind in (values.POSITIVE, values.SECONDS):
        from_text, from_value = _outcome(kind.parse, repr(x)), _outcome(kind.check, x)
        assert from_text[0] == from_value[0] == (0 < x <= kind.high), x  # nan: not > 0; inf: beyond
        if from_text[0]:
            assert from_text[1] == from_value[1] == x
        else:
            assert (
                from_text[1]
                == from_value[1]
                == (f"must be > 0{kind.unit} and at most {kind.high:g}{kind.unit}, got {x:.6g}")
            )
            assert len(from_text[1]) < 90, from_text[1]


@given(st.sampled_from([values.THRESHOLD, values.LEVEL]), st.floats(allow_nan=True, allow_infinity=True))
@example(values.LEVEL, 1.0)  # the bounds: (0, high)
@example(values.THRESHOLD, 10.0)
@example(values.THRESHOLD, 0.0)
def test_a_fraction_is_the_same_written_as_a_share_a_percent_or_a_number(kind, x) -> None:
    inside = 0 < x < kind.high
    for door, given_value in ((kind.check, x), (kind.parse, repr(x)), (kind.check, repr(x))):
        ok, value = _outcome(door, given_value)
        assert ok == inside, (given_value, value)
        assert value == x if ok else value.startswith("expected a share between 0 and")
    if inside and math.isfinite(x * 100):
        ok, value = _outcome(kind.parse, f"{x * 100!r}%")
        assert ok == (0 < x * 100 / 100 < kind.high) and (not ok or math.isclose(value, x, rel_tol=1e-12))


@given(st.floats(allow_nan=True, allow_infinity=True))
@example(1.0)  # the bounds: (0, 1]
@example(0.0)
def test_a_share_of_a_whole_is_the_same_from_text_and_from_a_value(x) -> None:
    from_text, from_value = _outcome(values.SHARE.parse, repr(x)), _outcome(values.SHARE.check, x)
    assert from_text[0] == from_value[0] == (0 < x <= 1), x
    if from_text[0]:
        assert from_text[1] == from_value[1] == x


@given(st.booleans(), st.sampled_from([str, str.upper, str.lower, lambda s: f"  {s} "]))
def test_a_flag_is_its_word_in_any_case_and_a_value_true_or_false(on, spell) -> None:
    word = spell(str(on))
    assert values.FLAG.parse(word) is on and values.FLAG.check(on) is on
    assert values.FLAG.parse(spell("yes" if on else "no")) is on
    assert not _outcome(values.FLAG.check, word)[0]  # a marker's flag is a bool, not a word
    assert not _outcome(values.FLAG.check, int(on))[0]


@given(st.sampled_from(CACHE_TYPES), st.sampled_from([str, str.upper, str.title]), st.text(max_size=6))
def test_a_choice_is_one_of_its_names_in_any_case(name, spell, other) -> None:
    kind = VALUE_KINDS["cache_type"]
    assert kind.parse(f" {spell(name)} ") == kind.check(spell(name)) == name
    if other.strip().lower() not in CACHE_TYPES:
        for door in (kind.parse, kind.check):
            ok, message = _outcome(door, other)
            assert not ok and message == f"must be one of {', '.join(CACHE_TYPES)}, got {other!r}" + did_you_mean(
                other, CACHE_TYPES
            )


def test_the_messages_say_what_was_expected() -> None:
    with pytest.raises(ValueError, match=r"^must be an integer >= -1 \(-1: all layers\), got -2$"):
        values.GPU_LAYERS.check(-2)  # a marker's gpu_layers=-2
    with pytest.raises(ValueError, match=r"^must be >= -1 \(-1: all layers\), got -2$"):
        values.GPU_LAYERS.parse("-2")  # --llmperf-gpu-layers=-2
    with pytest.raises(ValueError, match=r"^expected an integer >= 1, got 'many'$"):
        values.COUNT.parse("many")
    with pytest.raises(ValueError, match=r"^expected float, got 'soon'$"):
        values.SECONDS.parse("soon")
