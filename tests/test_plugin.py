"""The pytest plugin, driven through inner pytest sessions (pytester) on real llama.cpp."""

from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET

import pytest
from inner import run

from pytest_llmperf.session.options import KEYS

FAST = "max_tokens=8, runs=2, warmup=1, prompt_tokens=16"


def test_generous_budget_passes_tight_budget_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf(p95_ms=10_000, ttft_ms=10_000, min_tps=1, {FAST})
        def test_generous():
            pass

        @pytest.mark.llmperf(p95_ms=0.001, {FAST})
        def test_tight():
            pass
        """
    )
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.re_match_lines(
        [
            r"^decode ITL p95 [\d.]+ ms > budget 0\.001 ms \(95% CI [\d.]+\.\.\+inf, 14 tokens, 2 runs; "
            r"14 tokens cannot estimate a p95 at 95% \(about 72 bound it\)\)$"
        ]
    )
    result.stdout.fnmatch_lines(["*- llmperf -*", "*decode TPOT median*"])  # detail section
    assert "Traceback" not in result.stdout.str()


def test_unknown_marker_key_fails_collection_with_allowed_keys(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.llmperf(p59_ms=45)
        def test_typo():
            pass
        """
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*ERROR collecting*",
            "*test_typo: unknown llmperf marker key 'p59_ms'; did you mean 'p99_ms', 'p95_ms' or 'p90_ms'? "
            f"({len(KEYS)} in all: see pytest --markers, or README.md's marker keys)",
        ]
    )


@pytest.mark.parametrize(
    "args, message",
    [
        ("p95_ms=-3", "'p95_ms' must be > 0"),
        ("p95_ms='fast'", "'p95_ms' must be a number"),
        ("max_tokens=1", "'max_tokens' must be >= 2"),
        ("runs=0", "'runs' must be >= 1"),
    ],
)
def test_bad_marker_values_fail_collection(pytester: pytest.Pytester, args: str, message: str) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf({args})
        def test_bad():
            pass
        """
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert message in result.stdout.str()


def test_one_line_test_is_measured_and_summarized(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf({FAST})
        def test_decode(): pass

        def test_ordinary(): pass
        """
    )
    result = run(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*- llmperf summary -*", "test*TTFT ms*decode t/s*ITL p95 ms*budget*", "test_decode *"]
    )
    assert "test_ordinary" not in result.stdout.str().split("llmperf summary")[1]


def test_explicit_measure_with_overrides_and_callable(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf({FAST})
        def test_explicit(llmperf):
            m = llmperf.measure(prompt="Hello there, general", max_tokens=5)
            assert m.output_tokens == 5 and m.n_runs == 2
            assert m.engine.engine == "llama.cpp"

        def test_callable(llmperf):
            def stream(prompt, max_tokens):
                yield from range(max_tokens)
            m = llmperf.measure(stream, max_tokens=6, runs=3, p99_ms=1000)
            assert m.engine.engine == "callable" and m.output_tokens == 6

        def test_llm_fixture(llmperf_llm):
            assert llmperf_llm.tokenize(b"hi")[0] == 1
        """
    )
    result = run(pytester)
    result.assert_outcomes(passed=3)
    summary = result.stdout.str().split("llmperf summary")[1]
    assert len(re.findall(r"test_explicit\s", summary)) == 1  # not measured again automatically
    assert "test_callable" in summary


def test_failing_body_is_not_measured(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf({FAST})
        def test_broken():
            assert 1 == 2
        """
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    assert "llmperf summary" not in result.stdout.str()


def test_module_and_class_markers_merge(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        pytestmark = pytest.mark.llmperf(max_tokens=8, runs=2, prompt_tokens=16, p95_ms=0.001)

        class TestDecode:
            pytestmark = pytest.mark.llmperf(max_tokens=6)

            @pytest.mark.llmperf(p95_ms=10_000)
            def test_closest_wins(self, llmperf):
                m = llmperf.measure()
                assert m.output_tokens == 6 and m.n_runs == 2
        """
    )
    run(pytester).assert_outcomes(passed=1)


def test_junit_xml_has_properties_and_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf(p95_ms=10_000, {FAST})
        def test_ok(): pass

        @pytest.mark.llmperf(p95_ms=0.001, {FAST})
        def test_slow(): pass
        """
    )
    run(pytester, "--junitxml=out.xml")
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "out.xml").iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_ok"].iter("property")}
    assert props["llmperf.output_tokens"] == "8"
    assert float(props["llmperf.decode_tps"]) > 0
    assert props["llmperf.budget"] == "ok"
    failure = cases["test_slow"].find("failure")
    assert failure is not None and failure.get("message").startswith("decode ITL p95 ")


def test_quiet_modes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf({FAST})
        def test_a(): pass
        """
    )
    quiet = run(pytester, "-q")
    quiet.stdout.fnmatch_lines(["llmperf: 1 measurement(s), 0 over budget (drop -q for the table)"])
    assert "llmperf summary" not in quiet.stdout.str()
    assert "llmperf" not in run(pytester, "-qq").stdout.str()


ONE_PERF_TEST = f"import pytest\n\n@pytest.mark.llmperf({FAST})\ndef test_perf(): pass\n"


def test_report_header(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_PERF_TEST)
    result = run(pytester, "--collect-only")
    result.stdout.re_match_lines(
        [
            r"^llmperf: model synthetic-tiny \(embedded synthetic, 4 layers, 3\.4 M params, F32\), "
            r"threads \d+, n_ctx auto, llama-cpp-python \d+\.\d+\.\d+$"
        ]
    )


def test_model_setting_precedence(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nllmperf_model = from-ini.gguf\n")
    pytester.makepyfile(ONE_PERF_TEST)
    run(pytester, "--collect-only").stdout.fnmatch_lines(["llmperf: model from-ini.gguf (NOT FOUND)*"])
    monkeypatch.setenv("LLMPERF_MODEL", "from-env.gguf")
    run(pytester, "--collect-only").stdout.fnmatch_lines(["llmperf: model from-env.gguf (NOT FOUND)*"])
    run(pytester, "--collect-only", "--llmperf-model", "from-cli.gguf").stdout.fnmatch_lines(
        ["llmperf: model from-cli.gguf (NOT FOUND)*"]
    )


def test_own_model_path(pytester: pytest.Pytester, tiny_model_path) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.llmperf({FAST})
        def test_a(llmperf):
            assert llmperf.engine.info().model_path == {str(tiny_model_path)!r}
        """
    )
    result = run(pytester, "--llmperf-model", str(tiny_model_path), "--llmperf-threads", "1")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"llmperf: model {tiny_model_path.name} (13.1 MiB, F32), threads 1,*"])


MARKED = f"""
import pytest

@pytest.mark.llmperf({FAST})
def test_a(): pass

@pytest.mark.llmperf({FAST})
def test_b(): pass
"""


def test_missing_model_is_one_line_per_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    result = run(pytester, "--llmperf-model", "missing/model.gguf")
    result.assert_outcomes(failed=2)
    lines = [l for l in result.stdout.lines if "model file not found: missing/model.gguf" in l]
    assert len(lines) >= 2
    assert "Traceback" not in result.stdout.str()


def test_not_a_gguf_model(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    (pytester.path / "fake.gguf").write_text("hello")
    result = run(pytester, "--llmperf-model", "fake.gguf")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*not a GGUF model file (starts with b'hell', expected b'GGUF'): fake.gguf*"])


def test_context_too_small(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.llmperf(prompt_tokens=200, max_tokens=100, runs=1)
        def test_long(): pass
        """
    )
    result = run(pytester, "--llmperf-n-ctx", "256")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*context too small: 200 prompt + 100 generated tokens > n_ctx 256; raise --llmperf-n-ctx*"]
    )


@pytest.mark.parametrize("where", ["worker", "in-process"])
def test_llama_cpp_missing(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    if where == "worker":  # the engine worker's interpreter finds a llama_cpp that cannot be imported
        shadow = pytester.mkdir("shadow") / "llama_cpp"
        shadow.mkdir()
        (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'llama_cpp'\")\n")
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
        )
        args: tuple[str, ...] = ()
    else:
        monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
        args = ("--llmperf-in-process",)
    pytester.makepyfile(MARKED)
    result = run(pytester, *args)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*llama-cpp-python is not importable*; install it: pip install llama-cpp-python*"])


def test_bad_option_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = run(pytester, "--llmperf-threads", "many")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-threads: expected an integer >= 1, got 'many'*"])


def test_bad_environment_value_is_a_usage_error_naming_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    monkeypatch.setenv("LLMPERF_THREADS", "0")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*$LLMPERF_THREADS: must be >= 1, got 0*"])
