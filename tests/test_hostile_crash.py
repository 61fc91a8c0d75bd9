"""Hostile: llama.cpp dies under a test. That test fails with one line; the session goes on
and writes everything for the others (JSON, JUnit, the summary), in one process or under xdist.

The crash is real where it can be (the AMX SIGILL or SIGSEGV of a Q8_0 model on an AMX CPU; the abort of
a GGUF with more layers than llama.cpp allows) and injected in the worker otherwise
(``LLMPERF_WORKER_FAULT``, only for the model whose path contains ``crashy``).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pytest_llmperf import ModelSpec, ensure_model
from pytest_llmperf.engines.llama_cpp_native import AMX_ISSUE, cpu_has_amx
from pytest_llmperf.measuring.worker import FAULT_ENV

WORKLOAD = "prompt_tokens=4, max_tokens=4, runs=2, warmup=0"


def suite(crashy: Path) -> str:
    return f"""
import pytest

@pytest.mark.llmperf({WORKLOAD})
def test_before():
    pass

@pytest.mark.llmperf({WORKLOAD}, model={str(crashy)!r}, repack=True)
def test_crash():
    pass

@pytest.mark.llmperf({WORKLOAD})
def test_after():
    pass
"""


def check(result: pytest.RunResult, root: Path, says: list[str]) -> None:
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, output
    result.assert_outcomes(passed=2, failed=1)
    lines = [line for line in output.splitlines() if "llama.cpp worker died with" in line]
    assert len(lines) == 1, output  # -rN: pytest's short summary does not repeat it
    for text in says:
        assert text in lines[0], lines[0]
    assert "Fatal Python error" not in output and "Traceback" not in output
    assert "crashed" not in output.replace("crashed earlier", "")  # xdist replaced no worker
    data = json.loads((root / "session.json").read_text())
    assert sorted(r["test"].split("::")[-1] for r in data["results"]) == ["test_after", "test_before"]
    junit = (root / "junit.xml").read_text()
    assert junit.count("<testcase") == 3 and "llama.cpp worker died with" in junit
    result.stdout.fnmatch_lines(["*llmperf summary*"])


@pytest.fixture
def crashy(tmp_path: Path, tiny_model_path: Path) -> Path:
    path = tmp_path / "models" / "crashy.gguf"
    path.parent.mkdir()
    shutil.copy(tiny_model_path, path)
    return path


@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "xdist-n2"])
def test_a_crash_fails_one_test_and_the_session_goes_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, crashy: Path, xdist: bool
) -> None:
    monkeypatch.setenv(FAULT_ENV, "run:SIGSEGV:crashy")
    pytester.makepyfile(test_inner=suite(crashy))
    args = ["-p", "no:cacheprovider", "-rN", "--llmperf-json=session.json", "--junitxml=junit.xml"]
    if xdist:
        args += ["-n", "2"]
    result = pytester.runpytest_subprocess(*args, timeout=300)
    check(
        result,
        pytester.path,
        [
            "died with SIGSEGV (Segmentation fault) while running model crashy.gguf",
            "threads=1",
            "repack=True",
            "llama.cpp's last log lines: ",
        ],
    )


@pytest.mark.skipif(not cpu_has_amx(), reason="the real AMX crash needs an Intel CPU with AMX")
def test_amx_crash_of_a_q8_0_model_names_its_cause(pytester: pytest.Pytester, tmp_path: Path) -> None:
    spec = ModelSpec(name="q8", n_layer=2, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, dtype="Q8_0")
    model = ensure_model(spec, tmp_path / "models")
    # Two threads: the AMX kernel dies in llama.cpp's worker thread.
    pytester.makepyfile(test_inner=suite(model).replace("repack=True", "repack=True, threads=2"))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rN", "--llmperf-json=session.json", "--junitxml=junit.xml", timeout=300
    )
    check(
        result,
        pytester.path,
        [
            "Q8_0",
            f"known cause: llama.cpp's AMX kernel for quantized weights on this Intel CPU with AMX ({AMX_ISSUE}); "
            "set repack=False",
        ],
    )
    # SIGILL on one Xeon with AMX, SIGSEGV while loading on another (AMX_SIGNALS)
    assert re.search(
        r"died with (SIGILL \(illegal instruction\)|SIGSEGV \(Segmentation fault\)) while", result.stdout.str()
    )


def test_the_in_process_fixture_engine_is_checked_in_a_worker_first(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, crashy: Path
) -> None:
    """``llmperf_llm`` hands out the in-process Llama: a setting that would crash it fails
    that test (the preflight worker's line), not the session."""
    monkeypatch.setenv(FAULT_ENV, "run:SIGABRT:crashy")
    pytester.makepyfile(test_inner="def test_llm(llmperf_llm):\n    pass\n\ndef test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rN", f"--llmperf-model={crashy}", timeout=300)
    output = result.stdout.str()
    assert result.ret == 1, output
    result.assert_outcomes(passed=1, errors=1)
    assert output.count("llama.cpp worker died with SIGABRT (Aborted) while running model crashy.gguf") == 1, output


def test_llmperf_profile_of_a_gguf_that_aborts_llama_cpp_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``llmperf profile`` measures in a worker: llama.cpp's abort (a GGUF with more layers than
    it allows) is one error line with its assert and exit 2, not a silent exit 134."""
    import gguf

    from pytest_llmperf import write_gguf
    from pytest_llmperf.cli import main as cli_main

    real = gguf.GGUFWriter.add_block_count
    monkeypatch.setattr(gguf.GGUFWriter, "add_block_count", lambda self, n: real(self, 600))
    path = write_gguf(
        ModelSpec(name="deep", n_layer=2, n_embd=64, n_ff=128, n_head=2, n_head_kv=2), tmp_path / "d.gguf"
    )
    monkeypatch.undo()
    assert cli_main(["profile", str(path), "--runs", "2", "--threads", "1"]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if not line.startswith("llmperf: profile ")]  # its progress
    assert len(lines) == 1 and lines[0].startswith("llmperf: error: llama.cpp worker died with SIGABRT (Aborted)"), err
    assert "LLAMA_MAX_LAYERS) failed" in lines[0] and "known cause: the GGUF declares more layers" in lines[0]
    assert "Traceback" not in out + err
