"""Files written by the 0.1 code before the house was rebuilt (issue 48) still load and compare,
and the commands that read them print the same bytes.

tests/data/release-0.1/ was written by pytest-llmperf at commit 997442b from a project of two
marker-only tests (test_fx.py.txt): one update session (baselines/test_fx.json), then two
sessions with ``--llmperf-json`` (s2.json, s3.json), all three appended to history.sqlite;
compare.txt, history.txt and detect.txt are what ``llmperf compare s2.json s3.json``,
``llmperf history`` and ``llmperf detect`` printed on them at 80 columns. The readers' output
is a function of the files alone (no clock, no machine), so any byte that moves is a change a
user sees."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from inner import run

from pytest_llmperf.baselines import store
from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.core.fingerprint import hardware, hardware_key

DATA = Path(__file__).parent / "data" / "release-0.1"


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    """The release files in a folder of the test's own (a reader may open the database for
    writing: the fixture files stay as they are)."""
    folder = tmp_path / "release"
    shutil.copytree(DATA, folder)
    return folder


def _printed(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    status = cli_main(list(argv))
    out = capsys.readouterr().out
    assert status == 0, out
    return out


def test_compare_of_two_session_files_prints_the_same_bytes(copied, capsys, monkeypatch):
    out = _printed(capsys, monkeypatch, "compare", str(copied / "s2.json"), str(copied / "s3.json"))
    assert out == (DATA / "compare.txt").read_text()


def test_history_and_detect_of_a_release_database_print_the_same_bytes(copied, capsys, monkeypatch):
    history = str(copied / "history.sqlite")
    assert _printed(capsys, monkeypatch, "history", "--history", history) == (DATA / "history.txt").read_text()
    assert _printed(capsys, monkeypatch, "detect", "--history", history) == (DATA / "detect.txt").read_text()


def test_report_of_a_release_session_file_is_written(copied, capsys, monkeypatch):
    out = _printed(capsys, monkeypatch, "report", str(copied / "s3.json"), "-o", str(copied / "r.html"))
    assert out.strip() == f"{copied / 'r.html'}: 2 measurement(s)"
    assert "test_fx.py::test_short" in (copied / "r.html").read_text()


def test_a_release_baseline_file_loads_and_writes_back_byte_identical():
    path = DATA / "baselines" / "test_fx.json"
    tests = store.load(path)
    assert sorted(tests) == ["test_longer", "test_short"]
    document = json.loads(path.read_text())
    assert store.dumps(document) == path.read_text()


def test_a_release_baseline_is_compared_with_a_new_session(pytester: pytest.Pytester):
    """The release's baseline entries, filed under this machine's hardware key, judge a new
    session's measurements: every test is compared (its verdict has comparisons), none is
    'no baseline'."""
    document = json.loads((DATA / "baselines" / "test_fx.json").read_text())
    here = hardware()
    for entries in document["tests"].values():
        (entry,) = entries.values()
        entries.clear()
        entries[hardware_key(here)] = {**entry, "hardware": here}
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "test_fx.json").write_text(store.dumps(document))
    pytester.makepyfile(test_fx=(DATA / "test_fx.py.txt").read_text())
    result = run(pytester, "--llmperf-json=out.json", "--llmperf-threads=1", "--llmperf-history=off")
    assert result.ret in (0, 1), result.stdout.str()  # a verdict may fail a test; an error may not
    results = json.loads((pytester.path / "out.json").read_text())["results"]
    assert sorted(r["test"] for r in results) == ["test_fx.py::test_longer", "test_fx.py::test_short"]
    for r in results:
        assert r["verdict"]["status"] == "compared", r["verdict"]
        assert {c["metric"] for c in r["verdict"]["comparisons"]} >= {"ttft_ms", "tpot_ms"}
