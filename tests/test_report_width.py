"""The report reads right at 80 columns (issue 47, point 7, and the report text of point 6):
every terminal table within the terminal's width with distinct tests kept distinct (ids
shortened, cut only where they stay apart, else a numbered key), long lines wrapped with a
hanging indent, ``llmperf --help`` within 80 columns; the update run says what it records; the
Markdown regressions name their test; an RSS budget that failed reads as failed; an unknown
name gets "did you mean"; the HTML report never prints ``None ...`` and its log-axis tick
labels keep apart."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import re
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from inner import run
from test_metrics import measurement

from pytest_llmperf import cli
from pytest_llmperf.core.errors import ConfigError, did_you_mean, unknown_name
from pytest_llmperf.core.measurement import Measurement
from pytest_llmperf.judge.result import BaselineVerdict, MeasurementResult
from pytest_llmperf.judge.verdict import BaselineStatus
from pytest_llmperf.reports import session_file
from pytest_llmperf.reports.text import fit_table, metrics_table, short_ids, summary_table, wrap, wrapped_table
from pytest_llmperf.session import SessionSettings
from pytest_llmperf.session.assess import RECORDING, recording_note
from pytest_llmperf.session.finish import summary

WIDTHS = (60, 80, 120)

#: Long names alike but for a letter, in two folders: ``test_wr.._stream`` read alike.
SIMILAR = [
    f"tests/{folder}/test_streams.py::test_write_stream_{x}" for folder in ("folder_one", "folder_two") for x in "abc"
]


def _rows(ids: Sequence[str]) -> list[dict[str, object]]:
    """Summary rows of ``ids`` (as ``MeasurementResult.summary_row`` gives them)."""
    return [
        {"test": t, "ttft_ms": 1.08 + i, "decode_tps": 931.0 - i, "itl_p95_ms": 1.12, "budget": "FAIL max_rss_mib"}
        for i, t in enumerate(ids)
    ]


def _shown(cell: str, name: str, key: dict[str, str]) -> bool:
    """``cell`` (a table's first column) names ``name``: whole, cut in the middle with its
    ends kept (``a..z``), or a number of the table's key."""
    cell = cell.strip()
    if cell in key:
        return key[cell] == name
    if ".." in cell and cell != name:  # the cut's ".." may stand beside a dot of the name ("py...:")
        cuts = [i for i in range(len(cell) - 1) if cell.startswith("..", i)]
        return any(name.startswith(cell[:i]) and name.endswith(cell[i + 2 :]) for i in cuts)
    return cell == name


def _check_table(text: str, ids: Sequence[str], width: int) -> None:
    """Every line within ``width``; each row names its own test, and distinct tests' rows read
    apart (the first column, or the numbered key under the table)."""
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), "\n".join(line for line in lines if len(line) > width)
    names = short_ids(ids)
    keyed = lines[0].startswith("#")
    key: dict[str, str] = {}
    if keyed:  # " 1: folder_one/...": the key's lines under the table, each id whole (maybe wrapped)
        for match in re.finditer(r"^ *(\d+): (\S.*(?:\n {3,}\S.*)*)", text, re.MULTILINE):
            key[match.group(1)] = "".join(part.strip() for part in match.group(2).splitlines())
        assert sorted(key.values()) == sorted(set(short_ids(ids).values())), text
    cells: dict[str, str] = {}
    rule = next(i for i, line in enumerate(lines) if set(line) <= {"-", " "})
    body = [x for x in lines[rule + 1 :] if x.strip() and not x.startswith(" ") and not re.match(r"\d+: |-", x)]
    width0 = len(lines[rule].split("  ")[0])
    for line, test in zip(body, ids):
        cell = line[:width0].strip()
        assert _shown(cell, names[test], key), (cell, names[test], text)
        cells.setdefault(test, cell)
    assert len(set(cells.values())) == len(set(ids)), text


@pytest.mark.parametrize("width", WIDTHS)
def test_the_summary_table_fits_and_keeps_similar_tests_apart(width: int) -> None:
    text = summary_table(_rows(SIMILAR), None, width)
    _check_table(text, SIMILAR, width)
    assert "test_wr.._stream" not in text


def test_a_summary_too_narrow_for_the_ids_numbers_them_and_lists_them_whole() -> None:
    text = summary_table(_rows(SIMILAR), None, 60)
    assert text.splitlines()[0].split()[0] == "#"
    for n, test in enumerate(SIMILAR, 1):
        assert f"{n}: {short_ids(SIMILAR)[test]}" in text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["tests", "tests/perf/deeper", "a/b/c/d"]),
            st.sampled_from(["test_streams", "test_a_module_with_a_long_name"]),
            st.text(alphabet="abcdefghij_0123456789", min_size=1, max_size=40),
            st.sampled_from(["", "[16]", "[in-process]", "[x::y]"]),
        ),
        min_size=1,
        max_size=12,
        unique=True,
    ),
    st.integers(min_value=40, max_value=200),
)
@example(  # the cut's ".." beside the name's own dot and colon: "test_streams...:test_000000[16]"
    [
        ("tests", "test_streams", "0", ""),
        ("tests", "test_streams", "000000", "[16]"),
        ("tests", "test_a_module_with_a_long_name", "0", ""),
    ],
    82,
)
def test_any_names_at_any_width_fit_and_stay_apart(parts, width: int) -> None:
    ids = [f"{folder}/{module}.py::test_{name}{param}" for folder, module, name, param in parts]
    _check_table(summary_table(_rows(ids), None, width), ids, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_table_with_more_columns_than_fit_splits_or_wraps_within_the_width(width: int) -> None:
    headers = ["test", *(f"column {i} with a long header" for i in range(8))]
    rows = [[t, *(f"{i * 1234.5:.1f} / {i:.1f}" for i in range(8))] for t in SIMILAR]
    _check_table(fit_table(headers, rows, width), SIMILAR, width)
    text = wrapped_table(headers[1:], [r[1:] for r in rows], width)
    assert all(len(line) <= width for line in text.splitlines()), text
    assert all(f"{i * 1234.5:.1f}" in text for i in range(8))  # wrapped, never cut


@pytest.mark.parametrize("width", WIDTHS)
def test_the_metrics_table_fits_the_width_with_every_figure_whole(width: int) -> None:
    m = dataclasses.replace(
        measurement(), native_decode_ms_per_token=0.5, overhead_ms_per_token=0.1, python_sampling_ms_per_token=0.25
    )
    text = metrics_table(m, width)
    assert all(len(line) <= width for line in text.splitlines()), text
    flat = " ".join(text.split())
    for whole in (" ".join(line.split()) for line in metrics_table(m).splitlines() if line and "  " not in line):
        assert whole in flat  # the prose lines: wrapped, not cut

    def words(t: str) -> Counter[str]:
        return Counter(w for w in t.split() if set(w) != {"-"})

    assert words(text) == words(metrics_table(m))  # every cell's words, none cut or lost
    assert "processors" in text and "(Python)" in text


def test_prose_wraps_with_a_hanging_indent_and_breaks_nothing_but_overlong_words() -> None:
    line = "test_x: INCONCLUSIVE (TPOT, TPS): " + "cannot decide: 19.1% faster, not shown beyond or within 5%; " * 6
    wrapped = wrap(line.strip(), 80)
    assert len(wrapped) > 1 and all(len(w) <= 80 for w in wrapped)
    assert all(w.startswith("    ") for w in wrapped[1:]) and not wrapped[0].startswith(" ")
    assert " ".join(" ".join(wrapped).split()) == " ".join(line.split())
    path = "/tmp/" + "x" * 120
    assert all(len(w) <= 80 for w in wrap(f"llmperf: baselines written to {path}", 80))


def _verdict(test: str) -> MeasurementResult:
    failures = ("decode TPOT 1.23 ms vs 1.01 ms baseline (+21.8%): REGRESSION",)
    long_note = (
        "INCONCLUSIVE (TTFT): cannot decide: " + "the baseline and the between-session noise leave too much; " * 5
    )
    v = BaselineVerdict(BaselineStatus.COMPARED, note=long_note, short="REGRESSION decode", failures=failures)
    return MeasurementResult(test, test, verdict=v)


@pytest.mark.parametrize("width", WIDTHS)
def test_every_summary_line_is_within_the_width(width: int) -> None:
    results = [_verdict(t) for t in SIMILAR]
    rows = _rows(SIMILAR)
    lines = summary(SessionSettings.of("."), rows, results, None, [], verbosity=0, width=width)
    text = "\n".join(t for _, t in lines)
    assert all(len(line) <= width for line in text.splitlines()), text
    notes = [t for k, t in lines if k == "line" and "INCONCLUSIVE" in t]
    assert len(notes) == len(SIMILAR) and all("\n    " in n for n in notes)  # hanging indent


def test_the_markdown_regressions_name_their_test() -> None:
    md = session_file.markdown([_verdict(t) for t in SIMILAR])
    regressions = md.split("### Regressions\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert regressions == [f"- {t}: decode TPOT 1.23 ms vs 1.01 ms baseline (+21.8%): REGRESSION" for t in SIMILAR]


@pytest.mark.parametrize(
    "status, note",
    [
        (BaselineStatus.NO_BASELINE, "no baseline: run with --llmperf-update-baselines"),
        (
            BaselineStatus.OTHER_HARDWARE,
            "recorded on x86; this machine is arm; record one with --llmperf-update-baselines",
        ),
        (
            BaselineStatus.ERROR,
            "baselines/t.json is not JSON; re-record it with --llmperf-update-baselines (or restore it)",
        ),
        (BaselineStatus.COMPARED, "cannot judge TTFT: no runs; re-record with --llmperf-update-baselines"),
    ],
)
def test_the_update_run_says_what_it_does_never_to_run_itself(status: BaselineStatus, note: str) -> None:
    said = recording_note(BaselineVerdict(status, note))
    assert RECORDING in said and said.count("--llmperf-update-baselines") == 1
    assert "run with" not in said and "re-record" not in said and "record one with" not in said
    assert recording_note(BaselineVerdict(BaselineStatus.COMPARED, "busy machine")) == "busy machine"


def test_an_unknown_name_gets_did_you_mean_not_every_name() -> None:
    from pytest_llmperf.session.options import KEYS, validate

    with pytest.raises(ConfigError) as info:
        validate({"peak_rss_mib": 1})
    line = str(info.value)
    assert "did you mean 'max_rss_mib'?" in line and "\n" not in line
    assert len(line) < 160 and "p50_ms, p90_ms" not in line and str(len(KEYS)) in line
    with pytest.raises(ConfigError, match=r"^unknown llmperf setting 'thread'; did you mean 'threads'"):
        SessionSettings.of(".", thread=1)
    with pytest.raises(ValueError, match=r"unknown column\(s\) tft; did you mean 'ttft'\?"):
        from pytest_llmperf.core.settings import columns

        columns("tft")
    assert unknown_name("API", "opena", ["openai", "llama"]) == (
        "unknown API 'opena'; did you mean 'openai'? (one of openai, llama)"
    )
    assert unknown_name("key", "zzz", [f"k{i}" for i in range(30)], "README.md") == (
        "unknown key 'zzz' (30 in all: see README.md)"
    )
    assert did_you_mean("p59_ms", ["p50_ms", "p95_ms", "runs"]) == "; did you mean 'p95_ms' or 'p50_ms'?"


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subcommand's, however deep."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                out += _parsers(sub)
    return out


@pytest.mark.parametrize("columns", ["80", "300"])
def test_every_help_is_within_80_columns(monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    parsers = _parsers(cli.build_parser())
    assert len(parsers) > 10
    for parser in parsers:
        text = parser.format_help()
        too_wide = [line for line in text.splitlines() if len(line) > 80]
        assert not too_wide, (parser.prog, too_wide)


def test_the_html_workload_line_never_says_none() -> None:
    from pytest_llmperf.reports.html import _workload_notes

    r = MeasurementResult(
        "t.py::test_x",
        "t.py::test_x",
        record=Measurement.read({"workload": {"prompt_tokens": None, "max_tokens": 4}, "summary": {}}),
    )
    text = _workload_notes(r, "")
    assert "None" not in text and "a prompt whose tokens the engine does not count" in text
    assert "4 generated per run" in text


@settings(max_examples=200, deadline=None)
@given(
    st.floats(min_value=1e-4, max_value=1e4),
    st.floats(min_value=1.001, max_value=1e8),
    st.floats(min_value=0.5, max_value=8.0),
    st.booleans(),
)
def test_log_ticks_never_overlap(low: float, factor: float, length_in: float, horizontal: bool) -> None:
    from pytest_llmperf.reports.charts import TICK_GAP_IN, log_ticks, tick_label, tick_size_in

    high = low * factor
    ticks = log_ticks(low, high, length_in, horizontal)
    assert ticks == sorted(set(ticks))
    assert all(low * (1 - 1e-9) <= t <= high * (1 + 1e-9) for t in ticks) or len(ticks) == 1
    span = math.log10(high / low)
    for a, b in itertools.pairwise(ticks):
        room = length_in * math.log10(b / a) / span
        reach = (tick_size_in(tick_label(a), horizontal) + tick_size_in(tick_label(b), horizontal)) / 2
        assert room >= reach + TICK_GAP_IN - 1e-9, (ticks, room, reach)
    if factor >= 10 and length_in >= 2:
        assert ticks  # a decade or more on a real axis: at least one label


def test_a_chart_log_axis_takes_its_ticks_from_its_length() -> None:
    pytest.importorskip("matplotlib")
    from pytest_llmperf.reports.charts import log_ticks, new_chart, plain_log

    fig, ax = new_chart(3.2)
    ax.plot([0.002, 4000], [1, 2])
    ax.set_xscale("log")
    plain_log(ax.xaxis)
    low, high = ax.get_xlim()
    length = ax.get_position().width * fig.get_size_inches()[0]
    assert list(ax.xaxis.get_major_locator()()) == log_ticks(low, high, length, True)
    assert len(log_ticks(low, high, length, True)) < len(log_ticks(low, high, 40.0, True))  # fewer on a short axis


# --- a real session, piped at 80 columns -------------------------------------------------------

SUITE = """
import time
import pytest

def tokens(prompt, max_tokens):
    for _ in range(max_tokens):
        time.sleep(0.001)
        yield "t"

@pytest.mark.llmperf(max_tokens=4, runs=3, warmup=0, min_tps=1e9)
def test_write_stream_a(llmperf):
    llmperf.measure(engine=tokens)

@pytest.mark.llmperf(max_tokens=4, runs=3, warmup=0, max_rss_mib=1)
def test_write_stream_b(llmperf):
    llmperf.measure(engine=tokens)

@pytest.mark.llmperf(max_tokens=4, runs=3, warmup=0)
def test_write_stream_c(llmperf):
    llmperf.measure(engine=tokens)
"""

#: pytest's own lines (its header names the installed plugins, the tmp rootdir).
#: pytest's own lines: its header, and its short test summary (``-r``), which it cuts at the
#: terminal's width except where ``CI`` is set (CI runs this suite with CI=true).
PYTEST_LINES = ("platform ", "plugins: ", "rootdir: ", "cachedir: ", "configfile: ", "FAILED ", "ERROR ", "PASSED ")


def _too_wide(text: str, width: int) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width and not line.startswith(PYTEST_LINES)]


def test_a_session_piped_at_80_columns_reads_right(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    for folder in ("folder_one", "folder_two"):
        (pytester.path / "tests" / folder).mkdir(parents=True)
        (pytester.path / "tests" / folder / "__init__.py").write_text("")
        (pytester.path / "tests" / folder / "test_streams.py").write_text(SUITE)
    (pytester.path / "tests" / "__init__.py").write_text("")
    first = run(pytester, "tests", "-rA", "--llmperf-update-baselines")
    out = first.stdout.str()
    assert not _too_wide(out, 80), _too_wide(out, 80)
    assert "run with --llmperf-update-baselines" not in out  # the update run never tells a test to run it
    assert out.count(f"no baseline yet: {RECORDING}") == 6
    second = run(pytester, "tests", "-rA", "--llmperf-markdown=summary.md")
    out = second.stdout.str()
    assert not _too_wide(out, 80), _too_wide(out, 80)
    table = out.split("llmperf summary")[1].split("\n\n")[0]
    assert "test_wr.._stream" not in table
    for folder in ("folder_one", "folder_two"):  # distinct tests, distinct rows
        for x in "abc":
            assert (
                re.search(rf"^{folder[:8]}\S*{x}\b", table, re.MULTILINE)
                or f"{folder}/test_streams.py::test_write_stream_{x}" in table
            ), table
    assert len(re.findall(r"FAIL max_rss_mib", table)) == 2  # the RSS budget's failure, as failed
    md = (pytester.path / "summary.md").read_text()
    assert md.count("| FAIL |") == 4 and "peak RSS" in md.split("### Over budget")[1]


@pytest.mark.parametrize("width", WIDTHS)
def test_where_it_went_names_each_test_whole_within_the_width(width: int) -> None:
    from pytest_llmperf.reports.where import Explained, terminal_lines

    why = ("decode TPOT +8.8% (1.058..1.118): moved: outside llama.cpp +0.903 ms/token (+0.896..+0.915)",)
    entries = [Explained(t, "", "REGRESSION decode", why, (), True) for t in SIMILAR[:4]]
    lines = terminal_lines(entries, width, verbose=True)
    assert all(len(line) <= width for line in lines), lines
    text = " ".join(" ".join(lines).split())
    for name in short_ids([e.test for e in entries]).values():
        assert f"{name} (REGRESSION decode)" in text  # wrapped where it must be, never cut


def test_a_parts_tables_side_headers_never_read_alike() -> None:
    from pytest_llmperf.reports.where import SIDE_HEADER, side_headers

    assert side_headers(("baseline", "now")) == ("baseline", "now")
    a, b = side_headers(("flash-attn-on-long", "flash-attn-off-long"))
    assert a != b and len(a) <= SIDE_HEADER and len(b) <= SIDE_HEADER


def test_llmperf_profile_fits_the_terminal_and_keeps_every_word(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from pytest_llmperf.reports.profile import render

    args = [
        "profile",
        "--format",
        "json",
        "--threads",
        "1",
        "--runs",
        "3",
        "--max-tokens",
        "8",
        "--prompt-tokens",
        "16",
    ]
    assert cli.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    whole = render(report, "table")
    assert max(map(len, whole.splitlines())) > 80  # the unfitted form runs past 80 columns

    def words(t: str) -> Counter[str]:
        return Counter(w for w in t.split() if set(w) != {"-"})

    for width in WIDTHS:
        text = render(report, "table", width)
        assert all(len(line) <= width for line in text.splitlines()), text
        assert not words(whole) - words(text)  # every word kept (a split table repeats its first column)


def test_an_unknown_ini_key_is_one_warning_with_the_closest_key(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nllmperf_thread = 2\nllmperf_colums = ttft\nllmperf_zzzz = 1\n")
    pytester.makepyfile("def test_plain(): pass")
    result = run(pytester, "-W", "always::pytest.PytestConfigWarning")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert out.count("llmperf: unknown llmperf ini key 'llmperf_thread'; did you mean 'llmperf_threads'?") == 1
    assert "llmperf: unknown llmperf ini key 'llmperf_colums'; columns has no ini key: use --llmperf-columns" in out
    assert "llmperf: unknown llmperf ini key 'llmperf_zzzz' (the ini keys: docs/settings.md)" in out
