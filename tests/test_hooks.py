"""The hooks of hookspecs.py, through inner sessions whose conftest.py is docs/hooks.md's example
(read from the page, so the documented code is the code that runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from inner import run

DOC = Path(__file__).resolve().parent.parent / "docs" / "hooks.md"
FAST = "prompt_tokens=16, max_tokens=8, runs=3, warmup=0"


def example(name: str) -> str:
    """The python block after ``<!-- example: name -->`` in docs/hooks.md."""
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert match, f"docs/hooks.md has no example {name!r}"
    return match.group(1)


def session_results(pytester: pytest.Pytester, name: str = "session.json") -> list[dict]:
    return json.loads((pytester.path / name).read_text())["results"]


def test_hookspecs_are_registered_and_pytest_help_and_markers_work(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "def pytest_configure(config):\n"
        "    names = [n for n in dir(config.hook) if n.startswith('pytest_llmperf_')]\n"
        "    print('HOOKS', sorted(names))\n"
    )
    result = run(pytester, "--help")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["HOOKS ['pytest_llmperf_fingerprint', 'pytest_llmperf_make_engine', 'pytest_llmperf_result']"]
    )
    assert run(pytester, "--markers").ret == pytest.ExitCode.OK


def test_a_misspelt_argument_is_a_usage_error(pytester: pytest.Pytester) -> None:
    """pluggy checks implementations against the specs: a typo is caught at startup."""
    pytester.makeconftest("def pytest_llmperf_result(config, item, reslut):\n    return None\n")
    result = run(pytester)
    assert result.ret != pytest.ExitCode.OK
    assert "reslut" in result.stdout.str() + result.stderr.str()


def test_fingerprint_keys_are_stored_and_a_subject_change_is_named(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(example("fingerprint"))
    pytester.makepyfile(test_perf=f"import pytest\n\n@pytest.mark.llmperf({FAST})\ndef test_a(): pass\n")
    monkeypatch.setenv("INSTANCE_TYPE", "c7i.large")
    monkeypatch.setenv("SERVER_BUILD", "41")
    run(pytester, "--llmperf-update-baselines").assert_outcomes(passed=1)
    data = json.loads((pytester.path / "baselines" / "test_perf.json").read_text())
    (entries,) = data["tests"].values()
    ((hw_key, entry),) = entries.items()
    assert entry["hardware"]["instance_type"] == "c7i.large"
    assert entry["subject"]["server_build"] == "41"

    # Same build: compared, nothing changed. (Any verdict: a busy machine may make it a
    # regression; the subject's changes are what is checked here.)
    run(pytester, "--llmperf-json", "same.json")
    (same,) = session_results(pytester, "same.json")
    assert same["verdict"]["status"] == "compared" and same["verdict"]["changes"] == []
    assert same["hardware_key"] == hw_key

    # Another build: still compared, and the change is named next to the verdict.
    monkeypatch.setenv("SERVER_BUILD", "42")
    result = run(pytester, "--llmperf-json", "changed.json", "-rA")
    (changed,) = session_results(pytester, "changed.json")
    assert changed["verdict"]["status"] == "compared"
    assert changed["verdict"]["changes"] == ["server_build 41 -> 42"]
    assert changed["record"]["subject"]["server_build"] == "42"
    result.stdout.fnmatch_lines(["*changed since the baseline: server_build 41 -> 42*"])

    # Another instance type: another machine's baseline, not compared; the note names the key.
    monkeypatch.setenv("INSTANCE_TYPE", "m7i.large")
    result = run(pytester, "--llmperf-strict-env")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not comparable here*differs from*instance_type 'c7i.large' -> 'm7i.large'*"])


def test_a_fingerprint_value_json_cannot_store_fails_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("def pytest_llmperf_fingerprint(subject):\n    subject['when'] = object\n")
    pytester.makepyfile(test_perf=f"import pytest\n\n@pytest.mark.llmperf({FAST})\ndef test_a(): pass\n")
    result = run(pytester)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert re.search(
        r"^pytest_llmperf_fingerprint \(\S+conftest\.py\) set subject\['when'\] to <class 'object'>: ",
        out,
        re.MULTILINE,
    ), out
    assert "Traceback" not in out


OBSERVER = """
import json

import pytest

SEEN = []


@pytest.hookimpl(wrapper=True)
def pytest_llmperf_result(config, item, result):
    final = yield  # what the conftest's implementation returned (or None)
    shown = final or result
    SEEN.append({"test": item.nodeid, "label": shown.measurement.label,
                 "decode_tps": shown.measurement.decode_tps, "extra": dict(shown.extra_info)})
    return final


def pytest_unconfigure(config):
    with open("seen.json", "w") as fh:
        json.dump(SEEN, fh)
"""

RESULT_SUITE = f"""
import pytest

@pytest.mark.llmperf({FAST})
def test_auto(): pass

@pytest.mark.llmperf({FAST})
def test_two(llmperf):
    llmperf.measure(label="short")
    llmperf.measure(label="long", max_tokens=12)

@pytest.mark.known_slow
@pytest.mark.llmperf(tpot_ms=0.0001, {FAST})
def test_waived(): pass

@pytest.mark.llmperf(tpot_ms=0.0001, {FAST})
def test_over(): pass
"""


def test_result_hook_sees_each_result_and_its_change_reaches_the_json(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(example("result"))
    pytester.makepyfile(observer=OBSERVER, test_perf=RESULT_SUITE)
    pytester.makeini("[pytest]\nmarkers =\n    known_slow: waived budget breach\n")
    pytester.syspathinsert()  # -p observer
    result = run(pytester, "-p", "observer", "--llmperf-json", "session.json")
    result.assert_outcomes(passed=3, failed=1)  # test_over's breach stands; test_waived's is waived
    seen = json.loads((pytester.path / "seen.json").read_text())
    assert [(s["test"].split("::")[1], s["label"]) for s in seen] == [
        ("test_auto", ""),
        ("test_two", "short"),
        ("test_two", "long"),
        ("test_waived", ""),
        ("test_over", ""),
    ]
    results = {(r["nodeid"].split("::")[1], r["label"]): r for r in session_results(pytester)}
    assert len(results) == 5
    for s in seen:
        r = results[(s["test"].split("::")[1], s["label"])]
        assert r["extra_info"] == s["extra"]
        expected = round(2.50 / (s["decode_tps"] * 3600) * 1e6, 4)
        assert r["extra_info"]["usd_per_million_tokens"] == expected > 0
    waived = results[("test_waived", "")]
    assert waived["budget"] == "ok" and waived["budget_failures"] == []
    assert waived["extra_info"]["waived"] and "TPOT" in waived["extra_info"]["waived"][0]
    over = results[("test_over", "")]
    assert over["budget"] == "FAIL" and "waived" not in over["extra_info"]


WRONG_RETURNS = {
    "result": (
        "def pytest_llmperf_result(result):\n    return {'decode_tps': 1}\n",
        "*pytest_llmperf_result (*conftest.py) returned dict; return None or a Result*",
    ),
    "engine": (
        "def pytest_llmperf_make_engine():\n    return 42\n",
        "*pytest_llmperf_make_engine (*conftest.py) returned int; return an engine*",
    ),
}


@pytest.mark.parametrize("hook", sorted(WRONG_RETURNS))
def test_a_wrong_hook_return_fails_the_test_with_one_line(pytester: pytest.Pytester, hook: str) -> None:
    conftest, line = WRONG_RETURNS[hook]
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_perf=f"import pytest\n\n@pytest.mark.llmperf({FAST})\ndef test_a(): pass\n")
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([line])


def test_llmperf_llm_of_a_hook_engine_says_what_to_use(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(example("engine"))
    pytester.makepyfile(test_llm="def test_llm(llmperf_llm):\n    pass\n")
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*llmperf_llm: the session's engine (CallableEngine, from an --llmperf-endpoint or a pytest_llmperf_make_engine "
            "hook) has no llama_cpp.Llama object; use the llmperf_engine fixture"
        ]
    )
    assert "AttributeError" not in result.stdout.str() and "Traceback" not in result.stdout.str()


def test_engine_hook_engine_is_measured_and_reported(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(example("engine"))
    pytester.makepyfile(
        test_perf=f"""
import pytest

@pytest.mark.llmperf({FAST})
def test_session_engine(): pass

@pytest.mark.llmperf(threads=1, {FAST})
def test_own_setting(): pass

def test_fixture(llmperf_engine):
    assert llmperf_engine.info().model == "word_stream"
"""
    )
    result = run(pytester, "--llmperf-json", "session.json", "--llmperf-update-baselines")
    result.assert_outcomes(passed=3)
    results = session_results(pytester)
    assert len(results) == 2
    for r in results:
        subject = r["record"]["subject"]
        assert (subject["engine"], subject["model"]) == ("callable", "word_stream"), subject
        assert len(r["record"]["runs"]["tpot_ms"]) == 3
        # The stream sleeps 2 ms before each token: noise only adds to that.
        assert min(r["record"]["runs"]["tpot_ms"]) >= 2.0
        assert all(len(itl) == 7 for itl in r["record"]["itl_ms"])  # 8 tokens, each one measured
    result = run(pytester, "--llmperf-columns", "model,runs")  # compared with its own baseline
    result.stdout.fnmatch_lines(
        [
            "llmperf: pytest_llmperf_make_engine (*conftest.py) may provide the engine measured*",
            "*llmperf summary*",
            "*test_session_engine*word_stream*",
        ]
    )


def test_hook_keys_in_the_fingerprint_comparisons() -> None:
    from pytest_llmperf.core.fingerprint import hardware_differences, subject_changes

    base = {"engine": "llama.cpp", "python": "3.11.7"}
    # A hook's subject key: named as given when it changed or was dropped; new keys are not changes.
    assert subject_changes({**base, "server_build": "41"}, {**base, "server_build": "42"}) == ["server_build 41 -> 42"]
    assert subject_changes({**base, "server_build": "41"}, base) == ["server_build 41 -> None"]
    assert subject_changes(base, {**base, "server_build": "42"}) == []
    # Each differing hardware field once, the known ones by label, a hook's by its key.
    assert hardware_differences({"cpu": "A", "instance_type": "x"}, {"cpu": "B", "instance_type": "y"}) == [
        "CPU 'A' -> 'B'",
        "instance_type 'x' -> 'y'",
    ]
