"""Baseline files: reviewable, validated as data, written atomically, never silently lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_llmperf.baselines import store
from pytest_llmperf.baselines.store import BaselineError
from pytest_llmperf.core.fingerprint import hardware, hardware_key, model_digest, subject_changes


def entry(tpot: float = 6.5) -> dict:
    return {
        "recorded_at": "2026-11-30T00:00:00+00:00",
        "commit": "abc",
        "hardware": {"cpu": "x"},
        "subject": {"backend_version": "0.3.36"},
        "workload": {"prompt": None, "prompt_tokens": 64, "max_tokens": 64, "seed": 0},
        "runs": {"tpot_ms": [tpot, tpot + 0.1]},
        "itl_ms": [[tpot] * 3, [tpot] * 3],
        "summary": {},
    }


def test_update_merges_and_keeps_other_entries(tmp_path: Path) -> None:
    path = tmp_path / "tests" / "test_perf.json"
    store.update(path, {"test_a": {"hw1": entry(1.0)}, "test_b": {"hw1": entry(2.0)}})
    store.update(path, {"test_a": {"hw2": entry(3.0)}})
    store.update(path, {"test_b": {"hw1": entry(4.0)}})
    tests = store.load(path)
    assert sorted(tests) == ["test_a", "test_b"]
    assert sorted(tests["test_a"]) == ["hw1", "hw2"]  # several machines side by side
    assert tests["test_a"]["hw1"]["runs"]["tpot_ms"][0] == 1.0
    assert tests["test_b"]["hw1"]["runs"]["tpot_ms"][0] == 4.0
    assert not list(path.parent.glob(".*.tmp"))


def test_file_is_stable_and_reviewable(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    store.update(path, {"test_a": {"hw1": entry()}})
    first = path.read_text()
    store.update(path, {"test_a": {"hw1": entry()}})
    assert path.read_text() == first  # same data, same bytes: clean diffs
    assert '"tpot_ms": [6.5, 6.6]' in first  # number lists on one line
    data = json.loads(first)
    assert data["schema"] == store.SCHEMA and data["schema_version"] == store.SCHEMA_VERSION
    keys = [line.strip().split(":")[0] for line in first.splitlines() if line.startswith('  "')]
    assert keys == sorted(keys)


def test_module_file_mirrors_the_test_module(tmp_path: Path) -> None:
    assert store.module_file(tmp_path, "tests/perf/test_decode.py") == tmp_path / "tests/perf/test_decode.json"
    # Outside the rootdir: one file per module path, never another module's (``outside/test_x.py``).
    assert store.module_file(tmp_path, "../outside/test_x.py") == tmp_path / "__parent__/outside/test_x.json"
    assert store.module_file(tmp_path, "outside/test_x.py") == tmp_path / "outside/test_x.json"
    assert store.entry_key("tests/test_a.py::TestX::test_y[2]") == "TestX::test_y[2]"
    assert store.entry_key("tests/test_a.py::test_y", "long") == "test_y#long"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"schema": "pytest-llmperf/baselines", "schema_version": 1, "tests": {', "is not valid JSON"),
        ("", "is not valid JSON"),
        ("[1, 2]", "is not a pytest-llmperf baseline file"),
        ('{"schema": "pytest-llmperf/baselines", "schema_version": 99, "tests": {}}', "schema_version 99, newer"),
        ('{"schema": "pytest-llmperf/baselines", "schema_version": "1", "tests": {}}', "not an integer"),
        (
            '{"schema": "pytest-llmperf/baselines", "schema_version": 1, "tests": []}',
            "tests is an array, not an object",
        ),
        (
            '{"schema": "pytest-llmperf/baselines", "schema_version": 1, "tests": {"t": {"hw": '
            '{"runs": {"tpot_ms": ["fast"]}, "workload": {}, "subject": {}, "hardware": {}}}}}',
            "tests['t']['hw'].runs['tpot_ms'][0] is a string, not a number",
        ),
        (
            '{"schema": "pytest-llmperf/baselines", "schema_version": 1, "tests": {"t": {"hw": '
            '{"runs": {"tpot_ms": [NaN]}, "workload": {}, "subject": {}, "hardware": {}}}}}',
            "tests['t']['hw'].runs['tpot_ms'][0] is nan, not a finite number (JSON has none)",
        ),
        (
            '{"schema": "pytest-llmperf/baselines", "schema_version": 1, "tests": {"t": {"hw": {"runs": {}}}}}',
            "tests['t']['hw'] has no 'workload'",
        ),
    ],
)
def test_bad_files_are_one_line_errors_naming_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(BaselineError) as info:
        store.load(path)
    text = str(info.value)
    assert message in text and str(path) in text and "\n" not in text
    assert path.read_text() == content  # reading never touches the file


def test_update_moves_an_unreadable_file_aside(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text("{ truncated")
    moved = store.update(path, {"test_a": {"hw": entry()}})
    assert moved == tmp_path / "m.json.corrupt" and moved.read_text() == "{ truncated"
    assert "test_a" in store.load(path)


def test_missing_file_is_empty(tmp_path: Path) -> None:
    assert store.load(tmp_path / "none.json") == {}


def test_fingerprint_parts(tmp_path: Path) -> None:
    hw = hardware()
    assert hw["logical_cpus"] >= 1 and hw["os"] and hw["arch"]
    assert hardware_key(hw) == hardware_key(dict(hw))
    assert hardware_key({**hw, "cpu": "other"}) != hardware_key(hw)
    changes = subject_changes(
        {"backend_version": "0.3.35", "quantization": "Q8_0", "n_threads": 2, "model_size_bytes": 1},
        {"backend_version": "0.3.36", "quantization": "Q4_K", "n_threads": 1, "model_size_bytes": 2},
    )
    assert changes == ["llama-cpp-python 0.3.35 -> 0.3.36", "model Q8_0 -> Q4_K", "threads 2 -> 1"]


def test_model_digest_is_cheap_and_sensitive(tmp_path: Path) -> None:
    big = tmp_path / "big.gguf"
    with big.open("wb") as fh:  # sparse 2 GiB file
        fh.write(b"GGUF" + b"\0" * 100)
        fh.truncate(2 * 1024**3)
    started = time.perf_counter()
    digest = model_digest(big)
    assert time.perf_counter() - started < 0.5
    with big.open("r+b") as fh:
        fh.seek(10)
        fh.write(b"x")
    assert model_digest(big) != digest


WRITER = r"""
import sys
from pathlib import Path
from pytest_llmperf.baselines import store

path = Path(sys.argv[1])
print("ready", flush=True)
for i in range(100000):
    runs = {"tpot_ms": [float(i + 1)] * 2000, "ttft_ms": [float(i + 1)] * 2000}  # above 0: a valid file
    store.update(path, {f"test_{k}": {"hw": {"runs": runs, "workload": {}, "subject": {}, "hardware": {},
                                            "itl_ms": [[1.0] * 500] * 20}} for k in range(10)})
"""


def test_sigkill_during_writes_never_corrupts(tmp_path: Path) -> None:
    """20 SIGKILLs at seeded random moments while a process rewrites a ~1 MB baseline file
    in a loop: the file always loads, as one complete version."""
    import random

    path = tmp_path / "m.json"
    store.update(path, {"seed": {"hw": entry()}})
    rng = random.Random(1234)
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        tests = store.load(path)  # raises if the file were torn
        assert "seed" in tests
        values = {tuple(t["hw"]["runs"].get("tpot_ms", [])[:1]) for k, t in tests.items() if k != "seed"}
        assert len(values) <= 1  # every test entry from the same write: one version, not a mix
    store.update(path, {"after": {"hw": entry()}})
    assert not list(tmp_path.glob("*.tmp"))  # a later write sweeps a killed writer's temp files


def test_atomic_write_gives_files_the_usual_mode(tmp_path: Path) -> None:
    import stat

    from pytest_llmperf.baselines.store import atomic_write

    target = tmp_path / "report.json"
    old = os.umask(0o022)
    try:
        atomic_write(target, "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's owner-only 0o600
    target.chmod(0o640)
    atomic_write(target, "{}")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # an existing file keeps its mode


def test_corrupt_copies_are_numbered_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    copies = []
    for i in range(3):
        path.write_text(f"{{ broken {i}")
        copies.append(store.update(path, {"test_a": {"hw": entry()}}))
    assert [p.name for p in copies] == ["m.json.corrupt", "m.json.corrupt.1", "m.json.corrupt.2"]
    assert [p.read_text() for p in copies] == ["{ broken 0", "{ broken 1", "{ broken 2"]


def test_update_carries_valid_entries_over_from_a_file_with_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    bad = entry()
    bad["runs"] = {"tpot_ms": []}
    path.write_text(
        store.dumps(
            {
                "schema": store.SCHEMA,
                "schema_version": 1,
                "tests": {"test_bad": {"hw": bad}, "test_good": {"hw": entry(2.0)}},
            }
        )
    )
    original = path.read_text()
    with pytest.raises(BaselineError, match=r"runs\['tpot_ms'\] is empty; re-record"):
        store.load(path)
    moved = store.update(path, {"test_new": {"hw": entry()}})
    assert moved.read_text() == original
    assert sorted(store.load(path)) == ["test_good", "test_new"]


def test_a_newer_schema_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{"schema": "pytest-llmperf/baselines", "schema_version": 2, "tests": {"t": {}}}')
    before = path.read_bytes()
    with pytest.raises(store.NewerSchemaError) as info:
        store.update(path, {"test_a": {"hw": entry()}})
    assert str(info.value) == (
        f"baselines not written to {path}: it has schema_version 2, newer than this pytest-llmperf "
        "understands (1); upgrade pytest-llmperf to update it"
    )
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_a_failed_write_is_one_line_and_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    path = tmp_path / "m.json"
    store.update(path, {"test_a": {"hw": entry()}})
    before = path.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store.os, "fsync", full)
    with pytest.raises(BaselineError) as info:
        store.update(path, {"test_b": {"hw": entry()}})
    monkeypatch.undo()
    assert str(info.value) == f"cannot write baseline file {path}: No space left on device; the file is unchanged"
    assert path.read_bytes() == before and not list(tmp_path.glob(".*.tmp"))
