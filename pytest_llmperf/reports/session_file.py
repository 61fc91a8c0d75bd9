"""One session's results: baselines to write, the JSON report, the Markdown summary; one test's
report parts (``call_report``) and the views of an outcome that the summary and JUnit show.

Results are ``judge.result.Outcome`` objects (they cross pytest-xdist's wire as their
``to_json()``), and only the process that owns the session (the xdist controller, or the single
process) writes files, so workers never race on a baseline file. The session file's format is
``pytest_llmperf/schemas/session.schema.json``; ``read_session`` checks a file against it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..baselines import store as baseline_store
from ..core.catalog import FIGURES, HEADLINE, SUMMARY
from ..core.documents import JSONValue, RefusedFile, SchemaViolation, loads, read_text, validate
from ..core.formats import cell, fmt, fmt_or, render_table
from ..core.measurement import PromptSeen, Turn
from ..core.settings import COLUMN_SETS, DEFAULT_COMPARISON_COLUMNS
from ..judge.ab import ABResult
from ..judge.ab import as_dict as ab_dict
from ..judge.ab import properties as ab_properties
from ..judge.budgets import BudgetState
from ..judge.parts import part_properties
from ..judge.regression import carry_history
from ..judge.result import Outcome, ResultError
from ..judge.verdict import BaselineStatus, Comparison, Shown, Verdict, fmt_ratio
from ..measuring.interleave import Interleaved, turns
from .text import fit_table, metrics_table, short_ids, span_text, wrap_text
from .where import LEGEND, Explained, explained, moved, part_cells

SESSION_SCHEMA = "pytest-llmperf/session"
SESSION_SCHEMA_VERSION = 1


def write_baselines(
    baseline_dir: Path, results: Iterable[Outcome], errors: list[str] | None = None
) -> list[tuple[Path, Path | None]]:
    """Merge each result's record into its module's file; returns (file, moved-aside corrupt file).

    ``errors``: a file that cannot be written adds its one-line reason there and the others
    are still written (without it, the ``BaselineError`` is raised)."""
    by_file: dict[str, dict[str, dict[str, dict[str, JSONValue]]]] = defaultdict(dict)
    for r in results:
        if r.record is not None:
            by_file[r.baseline_file].setdefault(r.key, {})[r.hardware_key] = r.record.to_json()
    written = []
    for rel, entries in sorted(by_file.items()):
        path = baseline_dir / rel
        try:
            written.append((path, baseline_store.update(path, entries, merge=carry_history)))
        except baseline_store.BaselineError as exc:
            if errors is None:
                raise
            errors.append(f"llmperf: {exc}")
    return written


def session_json(
    results: Iterable[Outcome],
    created_at: str,
    ab: list[Mapping[str, object]] | None = None,
    against: Mapping[str, object] | None = None,
) -> str:
    """The ``--llmperf-json`` file; ``ab``: the A/B comparisons (``llmperf.compare()``), under
    their own key (written only when the session ran one); ``against``: what ``--llmperf-against``'s
    REF and both sides were (``Session.against_sides``; written only under that option)."""
    data: dict[str, object] = {
        "schema": SESSION_SCHEMA,
        "schema_version": SESSION_SCHEMA_VERSION,
        "created_at": created_at,
        "results": [r.to_json() for r in results],
    }
    if ab:
        data["ab"] = ab
    if against:
        data["against"] = dict(against)
    return json.dumps(data, indent=1, sort_keys=True, allow_nan=False)


#: What to do about a session file that cannot be read.
REDO = "write the report again with pytest --llmperf-json"


def load_session(path: Path | str) -> list[Outcome]:
    """Results of a saved ``--llmperf-json`` report (``read_session``)."""
    return read_session(path)[1]


#: What to do about a session report over the size limit.
SMALLER = "write smaller reports (fewer tests or runs per session)"


def read_session(path: Path | str) -> tuple[dict[str, Any], list[Outcome]]:
    """A saved ``--llmperf-json`` report and its results, checked against
    ``schemas/session.schema.json``; one line naming the file, the place in it and what to do
    if it is not one (the file is only read, and only a regular file within
    ``core.documents.MAX_DOCUMENT_MIB``)."""
    data = _session_document(path)
    try:
        validate(data, "session")
        results = [Outcome.from_json(r, f"results[{i}]", check=False) for i, r in enumerate(data["results"])]
    except (SchemaViolation, ResultError) as exc:  # ResultError: a state no pytest-llmperf writes
        raise baseline_store.BaselineError(f"{path}: {exc}; {REDO}") from None
    return data, results


def _session_document(path: Path | str) -> dict[str, Any]:
    """The file's JSON object, if it is a session report this version reads (not yet checked
    against the schema); else one line that says why not."""
    try:
        data = loads(read_text(path, "session report", SMALLER))
    except FileNotFoundError:
        raise baseline_store.BaselineError(f"session report not found: {path}") from None
    except RefusedFile as exc:
        raise baseline_store.BaselineError(str(exc)) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: JSONDecodeError, DuplicateKey
        raise baseline_store.BaselineError(f"{path} is not a readable JSON session report: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SESSION_SCHEMA:
        raise baseline_store.BaselineError(
            f"{path} is not a pytest-llmperf session report (write one with --llmperf-json)"
        )
    version = data.get("schema_version", 0)
    if isinstance(version, int) and not isinstance(version, bool) and version > SESSION_SCHEMA_VERSION:
        raise baseline_store.BaselineError(f"{path} is from a newer pytest-llmperf; upgrade to read it")
    return data


COMPARISON_HEADERS = ("test", "metric", "baseline", "now", "change", "95% CI", "p (Holm)", "verdict", "detects")
#: The same columns when every comparison is against ``--llmperf-against``'s REF: REF's figure,
#: this tree's, and the paired ratio (this tree / REF) with its 95% CI.
AGAINST_HEADERS = ("test", "metric", "REF", "now", "now/REF", "95% CI", "p (Holm)", "verdict", "detects")
#: ``--llmperf-columns`` names of the comparison columns after test and metric.
COMPARISON_COLUMNS = {"baseline": 2, "now": 3, "change": 4, "ci": 5, "p": 6, "verdict": 7, "detects": 8}
#: The terminal's default comparison columns against REF where they fit: both sides' figures too
#: (else the usual default: the ratio now/REF, its CI and the verdict).
AGAINST_COLUMNS = ("baseline", "now", "change", "ci", "verdict")
#: Verdicts that decide; any other one (the cannot-decide verdict) has its reason printed.
DECIDED = frozenset({Verdict.REGRESSION, Verdict.IMPROVED, Verdict.UNCHANGED})


def metric_label(label: str, phase: str, unit: str) -> str:
    """``decode TPS (t/s)``, ``prefill TTFT (ms)``: the phase once, even when the label has it."""
    name = label if label.split(" ", 1)[0] == phase else f"{phase} {label}"
    return f"{name} ({unit})"


def detects_cell(c: Comparison) -> str:
    """The comparison's reach (``Comparison.detectable``): ``>=14%``, ``too few runs`` (decided,
    but too few runs to state one), or ``n/a``."""
    if c.detectable is None:
        return "too few runs" if c.reach() else "n/a"
    return ">=999%" if c.detectable >= 9.99 else f">={c.detectable:.0%}"


def reach_lines(results: Iterable[Outcome], *, short: bool = False) -> list[str]:
    """Per compared test, what the gate can detect per phase and where its noise estimate came
    from, e.g. ``test_a: prefill detects >= 14% here; between-session sd 6.1% from 10
    session(s) of the history; decode ...``."""
    results = list(results)
    names = short_ids([r.test for r in results]) if short else {}
    lines = []
    for r in results:
        parts = [f"{c.phase} {c.label}: {c.reach()}" for c in _comparisons(r) if c.mirror_of is None and c.reach()]
        if parts:
            lines.append(f"{names.get(r.test, r.test)}: " + "; ".join(parts))
    return lines


def reach_summary(results: Iterable[Outcome]) -> str | None:
    """One line: the median reach per phase over the compared tests (the terminal's default)."""
    by_phase: dict[str, list[float | None]] = {}
    for r in results:
        for c in _comparisons(r):
            if c.mirror_of is None and c.metric in ("ttft_ms", "tpot_ms") and c.reach():
                by_phase.setdefault(c.phase, []).append(c.detectable)
    if not by_phase:
        return None
    parts = [_median_reach(phase, v) for phase, v in sorted(by_phase.items(), key=lambda kv: kv[0] != "prefill")]
    n = max(len(v) for v in by_phase.values())
    return (
        f"llmperf: this gate detects here (median of {n} test(s), 80% power): {', '.join(parts)}; "
        "-v: per test, with the noise estimate; --llmperf-columns ...,detects: per comparison"
    )


def _median_reach(phase: str, reaches: list[float | None]) -> str:
    """``prefill >= 14%``; a test with too few runs to state a reach counts as the largest, so
    the median is stated only when most tests state one."""
    stated = [v for v in reaches if v is not None]
    if len(stated) == len(reaches):
        return f"{phase} >= {statistics.median(stated):.0%}"
    ordered = sorted(reaches, key=lambda v: math.inf if v is None else v)
    middle = ordered[(len(ordered) - 1) // 2]
    return f"{phase}: too few runs to state a reach" if middle is None else f"{phase} >= {middle:.0%}"


def _comparisons(r: Outcome) -> tuple[Comparison, ...]:
    return r.verdict.comparisons if r.verdict is not None else ()


def against_of(results: Iterable[Outcome]) -> str:
    """REF (``git:main (3f2a1b9c0d1e)``) when every compared result was judged against
    ``--llmperf-against``'s REF, else "" (stored baselines, or nothing compared)."""
    refs = {r.reference for r in results if _comparisons(r)}
    return next(iter(refs)) if len(refs) == 1 else ""


def comparison_headers(results: Iterable[Outcome]) -> tuple[str, ...]:
    return AGAINST_HEADERS if against_of(results) else COMPARISON_HEADERS


def change_cells(c: Comparison, paired: bool) -> tuple[str, str]:
    """The change and its 95% CI: ``+7.2%``, ``+3.1..+11.4%``; ``paired`` (against REF): the ratio
    this tree / REF and its CI, ``1.072``, ``1.031..1.114``. A change of medians with no CI of its
    own (a rate that is not the reciprocal of the time it mirrors: prefill TPS over a prompt
    set's lengths) says so (``medians only``), as does one with no CI at all (``no CI``)."""
    if c.ci_low is None or c.ci_high is None:
        no_ci = "medians only" if c.shown is Shown.MEDIAN else "no CI"
        return (fmt_ratio(c.ratio) if paired else f"{(c.ratio - 1) * 100:+.1f}%"), no_ci
    if paired:
        return fmt_ratio(c.ratio), f"{fmt_ratio(c.ci_low)}..{fmt_ratio(c.ci_high)}"
    return f"{(c.ratio - 1) * 100:+.1f}%", f"{(c.ci_low - 1) * 100:+.1f}..{(c.ci_high - 1) * 100:+.1f}%"


def summary_values(r: Outcome) -> Mapping[str, Any]:
    """The headline figures: the record's ``summary``, or (judged against REF: no record) the
    figures as measured."""
    return (r.record.summary if r.record else None) or (r.figures.values() if r.figures is not None else {})


def comparison_cells(c: Comparison, paired: bool) -> list[str]:
    """A comparison's cells from its metric to p (the terminal, Markdown and HTML tables'):
    both sides' figures, the change and its CI (``change_cells``), p (Holm's where adjusted)."""
    p = c.p_adjusted if c.p_adjusted is not None else c.p_value
    figures = [metric_label(c.label, c.phase, c.unit), fmt(c.baseline_value), fmt(c.candidate_value)]
    return [*figures, *change_cells(c, paired), "n/a" if p is None else f"{p:.3g}"]


def comparison_rows(results: Iterable[Outcome]) -> list[list[str]]:
    results = list(results)
    paired = bool(against_of(results))
    return [
        [r.test, *comparison_cells(c, paired), c.verdict.value, detects_cell(c)]
        for r in results
        for c in _comparisons(r)
    ]


def comparison_table(results: Iterable[Outcome], columns: Sequence[str] | None = None, width: int | None = None) -> str:
    """The comparison table; with ``width`` (a terminal's), only ``columns`` (default
    ``DEFAULT_COMPARISON_COLUMNS``; against REF, ``AGAINST_COLUMNS`` where they fit) and test ids
    shortened to fit."""
    results = list(results)
    rows = comparison_rows(results)
    if not rows:
        return ""
    headers = comparison_headers(results)
    if width is None:
        return render_table(headers, rows)

    def table(chosen: Sequence[str], keyed: bool = True) -> str:
        keep = [0, 1] + [COMPARISON_COLUMNS[c] for c in chosen]
        return fit_table([headers[i] for i in keep], [[row[i] for i in keep] for row in rows], width, keyed)

    chosen = tuple(dict.fromkeys(c for c in (columns or ()) if c in COMPARISON_COLUMNS)) or DEFAULT_COMPARISON_COLUMNS
    # Against REF by default: both sides' figures too, only where they fit as they are.
    wide = table(AGAINST_COLUMNS, keyed=False) if against_of(results) and chosen == DEFAULT_COMPARISON_COLUMNS else ""
    return wide or table(chosen)


def undecided_lines(results: Iterable[Outcome], *, short: bool = False) -> list[str]:
    """Why a comparison could not decide (e.g. the runs needed), one line per test and reason;
    ``short``: test ids as the terminal tables show them."""
    results = list(results)
    names = short_ids([r.test for r in results]) if short else {}
    lines = []
    for r in results:
        # Metrics that share a reason share a line (side remarks after "; also " aside).
        by_reason: dict[tuple[str, str], list[str]] = {}
        for c in _comparisons(r):
            if c.verdict not in DECIDED and c.reason:
                by_reason.setdefault((c.verdict.value, c.reason.split("; also ")[0]), []).append(c.label)
        for (verdict, reason), labels in by_reason.items():
            lines.append(f"{names.get(r.test, r.test)}: {verdict} ({', '.join(labels)}): {reason}")
    return lines


def budget_failures(results: Iterable[Outcome]) -> list[str]:
    """``test: breach; breach`` for every measurement over one of its budgets."""
    return [f"{r.test}: {'; '.join(r.budget_failures) or 'over budget'}" for r in results if r.over_budget]


def regression_lines(results: Iterable[Outcome]) -> list[str]:
    """``test: regression line`` for every regression of the session (the test's full id)."""
    return [f"{r.test}: {f}" for r in results if r.verdict is not None for f in r.verdict.failures]


def against_line(results: Sequence[Outcome], against: Mapping[str, Any] | None = None) -> str | None:
    """``Judged against REF `git:main (3f2a1b9c0d1e)`: ...`` (the Markdown summary's line), None
    when nothing was judged against ``--llmperf-against``'s REF; ``against``: ``Session.against_sides``."""
    against = against or {}
    described = against.get("described") or against_of(results)
    if not described:
        return None
    pairs = sorted(r.verdict.pairs for r in results if r.reference and r.verdict is not None)
    span = "no" if not pairs else span_text(pairs[0], pairs[-1])
    who = _sides_text(against.get("sides") or {})
    return (
        f"Judged against REF `{described}`: {len(pairs)} of {len(results)} measurement(s) compared with REF's "
        f"runs interleaved pair by pair in this session ({span} pairs each; ratio = this tree / REF)"
        + (f"; {who}" if who else "")
        + ". Baselines were neither read nor written."
    )


def _sides_text(sides: Mapping[str, Mapping[str, object]]) -> str:
    """``REF: Python 3.12.1, llama-cpp-python 0.3.2; this tree: ...``: what each side ran on."""
    return "; ".join(
        f"{'REF' if name == 'REF' else 'this tree'}: Python {v.get('python') or '?'}, "
        f"llama-cpp-python {v.get('llama_cpp') or '?'}"
        for name, v in sorted(sides.items(), key=lambda kv: kv[0] != "REF")
    )


#: The Markdown summary's memory and start-up table: the terminal's memory column set
#: (``settings.COLUMN_SETS["memory"]``), then what the fresh loads found in the page cache.
MEMORY_FIGURES = (*(f.key for f in SUMMARY.values() if f.column in COLUMN_SETS["memory"]), "load_page_cache")


#: The "Your code's prompt and stream" table's columns: a measured callable's ``prompt`` figures.
PROMPT_COLUMNS = (
    ("prompt_cache", "prompt cache"),
    ("prompt_tokens", "prompt tokens"),
    ("evaluated_prompt_tokens", "evaluated"),
    ("prompt_reused_tokens", "reused"),
    ("delivered_items", "items delivered"),
    ("delivered_burst_tokens", "most tokens in one item"),
    ("delivered_ttft_ms", "delivered TTFT ms"),
)


def prompt_lines(results: Iterable[Outcome]) -> list[str]:
    """A table of each measured callable's prompt as llama.cpp saw it (cold or warm, the tokens
    evaluated and reused) and its stream as the caller got it, when a result has them."""
    rows = [(r.test, r.prompt) for r in results if r.prompt]
    return _figures_table("Your code's prompt and stream", PROMPT_COLUMNS, rows)


#: The "Conversations, turn by turn" table's columns: a conversation's ``prompt.turns`` figures.
TURN_COLUMNS = (
    ("turn", "turn"),
    ("runs", "runs"),
    ("evaluated_prompt_tokens", "prompt tokens evaluated"),
    ("prompt_reused_tokens", "reused"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p95_ms", "TTFT p95 ms"),
    ("tpot_ms", "decode ms/token"),
)


def turn_lines(results: Iterable[Outcome]) -> list[str]:
    """A table of each conversation's figures turn by turn (its ``prompt.turns``), when a result has them."""
    rows = [(r.test, t.to_json()) for r in results for t in turns_of(r.prompt)]
    return _figures_table("Conversations, turn by turn", TURN_COLUMNS, rows)


def _figures_table(
    title: str, columns: Sequence[tuple[str, str]], rows: Sequence[tuple[str, Mapping[str, object]]]
) -> list[str]:
    """The section ``title``: a row per (test, its figures), a column per (key, label) of ``columns``."""
    if not rows:
        return []
    out = ["", f"### {title}", "", *_md_head(["test", *(label for _, label in columns)])]
    return out + [_md_row([md_code(test), *(cell(f.get(key)) for key, _ in columns)]) for test, f in rows]


def turns_of(prompt: PromptSeen | None) -> tuple[Turn, ...]:
    """A stored conversation's ``prompt.turns``, each turn's figures (none where it holds none)."""
    return (prompt.turns or ()) if prompt is not None else ()


def memory_lines(results: Iterable[Outcome]) -> list[str]:
    """A "Memory and start-up" table, when a result has one of those figures."""
    rows = [(r.test, r.figures.values()) for r in results if r.figures is not None]
    rows = [(t, f) for t, f in rows if any(f.get(k) is not None for k in MEMORY_FIGURES)]
    if not rows:
        return []
    headers = ["test", *(f"{FIGURES[k].label} {FIGURES[k].unit}".strip() or k for k in MEMORY_FIGURES)]
    headers[-1] = "model loads"
    out = ["", "### Memory and start-up", "", *_md_head(headers)]
    return out + [_md_row([md_code(test), *_memory_cells(f)]) for test, f in rows]


def _memory_cells(f: Mapping[str, Any]) -> list[str]:
    """One measurement's memory figures (``MEMORY_FIGURES``); the model loads with their sample count."""
    cells = [fmt_or(f.get(k)) if k != "load_page_cache" else str(f.get(k) or "-") for k in MEMORY_FIGURES]
    if f.get("load_samples"):
        cells[-1] += f" ({f['load_samples']})"
    return cells


#: The agreement-with-REF table's columns (Markdown and HTML): figures of ``core.catalog.FIGURES``.
AGAINST_AGREEMENT = (
    ("top-1 agreement", "top1_agreement", ".4f"),
    ("KL mean (nats)", "kl_mean", ".4g"),
    ("KL p99 (nats)", "kl_p99", ".4g"),
    ("greedy parity", "greedy_parity", ".4f"),
    ("positions", "agreement_positions", "d"),
)


def against_agreement_rows(results: Iterable[Outcome]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the output agreement of each result judged against ``--llmperf-against``'s
    REF (A: REF, B: this tree): its figures and how they were computed, or why not."""
    figures = [(r.test, r.figures.values()) for r in results if r.figures is not None]
    rows = [
        [f"`{test}`", *(_ab_num(f.get(key), spec) for _, key, spec in AGAINST_AGREEMENT), str(f["agreement"])]
        for test, f in figures
        if f.get("agreement")
    ]
    return ["test", *(h for h, _, _ in AGAINST_AGREEMENT), "method"], rows


def markdown(
    results: Sequence[Outcome],
    extra: Iterable[str] = (),
    *,
    budgets_gate: bool = True,
    against: Mapping[str, object] | None = None,
    ab: Sequence[Mapping[str, object]] = (),
) -> str:
    """A GitHub-flavoured summary: one line per test, then the comparison table; ``ab``: the
    session's A/B comparisons (the session JSON's ``ab`` entries), a section after it.

    ``extra``: Markdown lines after the headline (the HTML report's link and key figure).
    The headline counts what fails the run: regressions and, unless ``--llmperf-baselines-only``,
    budget failures. ``against``: ``Session.against_sides`` under ``--llmperf-against``."""
    over = budget_failures(results) if budgets_gate else []
    judged = against_line(results, against)
    lines = [
        "## pytest-llmperf",
        "",
        *_measurements_headline(results, over, budgets_gate, ab),
        *_ab_headline(results, ab),
    ]
    lines += ["", judged] if judged else []
    for line in extra:
        lines += ["", line]
    lines += _results_table(results, judged)
    lines += _bullets("Over budget", over)
    lines += _bullets("Regressions", regression_lines(results))
    lines += _bullets("Not compared against REF", _not_compared_lines(results) if judged else [])
    lines += _bullets("Undecided", undecided_lines(results))
    lines += _bullets("What this gate detects here (80% power)", reach_lines(results))
    lines += memory_lines(results)
    lines += prompt_lines(results)
    lines += turn_lines(results)
    lines += _agreement_section(results)
    lines += _comparisons_section(results)
    lines += where_markdown_lines(explained(results, ab))
    lines += ab_markdown_lines(ab)
    return "\n".join(lines) + "\n"


def all_failed_markdown(planned: int) -> str:
    """The Markdown summary of a session none of whose measurements gave a result ("" when it
    planned none)."""
    if not planned:
        return ""
    return (
        "## llmperf\n\n"
        f"No results: every llmperf measurement of this session failed ({planned} planned, none measured); "
        "the test report says why.\n"
    )


def _measurements_headline(
    results: Sequence[Outcome], over: Sequence[str], budgets_gate: bool, ab: Sequence[Mapping[str, object]]
) -> list[str]:
    """``**2 of 5 measurement(s) failed**: 1 over budget, 1 regression(s).``, or that none did."""
    failing = sum(1 for r in results if (r.failed if budgets_gate else r.regressed))
    if failing:
        return [f"**{failing} of {len(results)} measurement(s) failed**: {_failed_how(results, over)}."]
    if results or not ab:
        return [f"No regression and no budget failure in {len(results)} measurement(s)."]
    return []


def _failed_how(results: Sequence[Outcome], over: Sequence[str]) -> str:
    """``1 over budget, 2 regression(s)``: what failed, each kind when there is one."""
    regressions = sum(len(r.verdict.failures) for r in results if r.verdict is not None)
    parts = [f"{len(over)} over budget"] if over else []
    parts += [f"{regressions} regression(s)"] if regressions else []
    return ", ".join(parts)


def _ab_headline(results: Sequence[Outcome], ab: Sequence[Mapping[str, object]]) -> list[str]:
    """How many A/B comparisons failed a budget (or that none did, when there was nothing else)."""
    ab_failed = sum(1 for e in ab if e.get("failures"))
    if ab_failed:
        return [f"**{ab_failed} of {len(ab)} A/B comparison(s) failed a budget** (section A/B comparisons)."]
    if ab and not results:
        return [f"No budget failure in {len(ab)} A/B comparison(s)."]
    return []


def _md_head(headers: Sequence[str]) -> list[str]:
    """A Markdown table's header and rule (the headers as they are)."""
    return [_md_row(headers), "|" + " --- |" * len(headers)]


def _results_table(results: Sequence[Outcome], judged: str | None) -> list[str]:
    """One row per measurement: its headline figures, budget state and verdict (against REF
    when ``judged``)."""
    if not results:
        return []
    headers = ["test", *(f.header for f in HEADLINE), "budget", "vs REF" if judged else "baseline"]
    lines = ["", *_md_head(headers)]
    for r in results:
        s = summary_values(r)
        short = "not compared" if r.verdict is None or (judged and not r.reference) else r.verdict.short
        cells = [md_code(r.test), *(fmt_or(s.get(f.key)) for f in HEADLINE), r.budget, short]
        lines.append(_md_row(cells))
    return lines


def _bullets(title: str, items: Sequence[str]) -> list[str]:
    """A ``### title`` section of one bullet per item; nothing when there is none."""
    return ["", f"### {title}", ""] + [f"- {md_line(line)}" for line in items] if items else []


def _not_compared_lines(results: Sequence[Outcome]) -> list[str]:
    """``test: why`` for each measurement not judged against ``--llmperf-against``'s REF."""
    return [
        f"{r.test}: {r.verdict.note if r.verdict is not None else 'not compared'}" for r in results if not r.reference
    ]


def _agreement_section(results: Sequence[Outcome]) -> list[str]:
    """The output agreement with REF, when a result has one."""
    headers, agreement = against_agreement_rows(results)
    if not agreement:
        return []
    return ["", "### Output agreement with REF (A: REF, B: this tree)", "", *_md_table(headers, agreement)]


def _comparisons_section(results: Sequence[Outcome]) -> list[str]:
    """Every baseline (or REF) comparison, one row each."""
    rows = comparison_rows(results)
    return ["", "### Comparisons", "", *_md_table(comparison_headers(results), rows)] if rows else []


def where_markdown_lines(entries: Sequence[Explained]) -> list[str]:
    """The "Where it went" section: per comparison whose phase moved (``where.moved``), its why
    lines and a parts table per moved phase; nothing when no phase moved."""
    chosen = moved(entries)
    if not chosen:
        return []
    out = ["", "### Where it went", "", LEGEND]
    for e in chosen:
        title = md_code(e.test) + (f": {md_cell(e.title)}" if e.title else "") + (f" ({e.state})" if e.state else "")
        out += ["", f"**{title}**", "", *(f"- {md_line(line)}" for line in e.why)]
        out += [f"- {md_line(line)}" for line in e.attribution_text()]
        for phase in e.moved_phases:
            out += ["", *_md_table(e.headers(phase), [part_cells(p) for p in e.of_phase(phase)])]
    return out


#: The A/B tables' columns (Markdown summary and HTML report): one row per paired comparison.
AB_HEADERS = ("metric", "A", "B", "B/A", "95% CI", "p", "pairs", "difference", "budget")


def _ab_num(value: float | None, spec: str = "") -> str:
    """A figure as ``spec`` formats it (default: ``fmt_ratio``); n/a where JSON holds none."""
    return "n/a" if value is None else format(value, spec) if spec else fmt_ratio(value)


def ab_title(entry: Mapping[str, Any]) -> str:
    """``B [name] vs A [name]``: the sides of one A/B (a session JSON ``ab`` entry)."""
    return f"B [{entry['b']['name']}] vs A [{entry['a']['name']}]"


def ab_pairs_line(entry: Mapping[str, Any]) -> str:
    """How an A/B's pairs ran (a session JSON ``ab`` entry, its ``interleaved`` read here):
    ``20 pairs interleaved (9 AB, 11 BA, seeded) token by token``, or run by run and why not token
    by token, in the words of the A/B's own line (``measuring.interleave.turns``); an entry of an
    older file, which does not say, says nothing of how its runs took turns."""
    orders = entry.get("orders") or []
    n_ab = sum(1 for o in orders if o == "AB")
    line = f"{len(orders)} pairs interleaved ({n_ab} AB, {len(orders) - n_ab} BA, seeded)"
    how = entry.get("interleaved")
    return line if how is None else f"{line} {turns(Interleaved(how), entry.get('unstepped'))}"


def ab_rows(entry: Mapping[str, Any]) -> list[list[str]]:
    """One row per paired comparison of an A/B (a session JSON ``ab`` entry): both medians, the
    ratio B/A with its 95% CI, p, whether the CI shows a difference, the relative budgets on it."""
    return [_ab_row(c, entry.get("budgets") or []) for c in entry.get("comparisons") or []]


def _ab_row(c: Mapping[str, Any], budgets: Sequence[Mapping[str, Any]]) -> list[str]:
    """One paired comparison's cells (``AB_HEADERS``); ``budgets``: the A/B's relative budgets."""
    lo, hi = c.get("ci_low"), c.get("ci_high")
    p = c.get("p_value")
    return [
        metric_label(c["label"], c["phase"], c["unit"]),
        fmt_or(c.get("a_median")),
        fmt_or(c.get("b_median")),
        _ab_num(c.get("ratio")),
        f"{_ab_num(lo)}..{_ab_num(hi)}",
        "n/a" if p is None else f"{p:.3g}",
        str(c.get("n_pairs", "?")),
        _difference_shown(lo, hi),
        ", ".join(f"{b['kind']} {b['status']}" for b in budgets if b.get("metric") == c["metric"]) or "-",
    ]


def _difference_shown(lo: float | None, hi: float | None) -> str:
    """Which way the ratio B/A's CI shows a difference, if it shows one."""
    if lo is None or hi is None:
        return "n/a"
    return "B slower" if lo > 1.0 else "B faster" if hi < 1.0 else "none shown"


def agreement_rows(entry: Mapping[str, Any]) -> list[list[str]]:
    """The output agreement of an A/B (a session JSON ``ab`` entry) as (figure, value) rows;
    one row saying why when it is not available; none when it was not computed."""
    g = entry.get("agreement")
    if not g:
        return []
    if not g.get("available"):
        return [["agreement", f"not available: {g.get('reason') or 'unknown'}"]]
    parted = [d for d in g.get("first_divergence") or [] if d is not None]
    first = "none" if not parted else f"token {min(parted)} ({len(parted)} of {g.get('n_prompts')} prompts part)"
    n_prompts = g.get("n_prompts", 0)
    rows = [
        ["method", str(g.get("method"))],
        ["sample", f"{g.get('n_positions')} positions over {n_prompts} prompt{'s' if n_prompts != 1 else ''}"],
        ["top-1 agreement (teacher-forced on A's tokens)", _ab_num(g.get("top1_agreement"), ".4f")],
        ["KL(A||B) mean", _ab_num(g.get("kl_mean"), ".4g")],
        ["KL(A||B) p99", _ab_num(g.get("kl_p99"), ".4g")],
        ["KL(A||B) max", _ab_num(g.get("kl_max"), ".4g")],
        ["greedy parity", _ab_num(g.get("greedy_parity"), ".4f")],
        ["first divergence", first],
    ]
    if g.get("n_unscored"):
        rows.insert(2, ["positions without a server's probabilities", str(g["n_unscored"])])
    return rows


def ab_budget_lines(entry: Mapping[str, Any]) -> list[tuple[BudgetState, str]]:
    """Every relative and agreement budget of an A/B (a session JSON ``ab`` entry, its outcome
    read here): (outcome, its line, which says it)."""
    every = [*(entry.get("budgets") or []), *(entry.get("agreement_budgets") or [])]
    return [(BudgetState(b["status"]), str(b["line"])) for b in every]


def md_line(text: str) -> str:
    """``text`` on one Markdown line: a line break in it (a test id may hold one) shown as ``\\n``."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def md_cell(text: str) -> str:
    """``text`` in one Markdown table cell: on one line, its ``|`` escaped (GitHub reads an
    escaped ``|`` as the character, in code spans too)."""
    return md_line(text).replace("|", "\\|")


def md_code(text: str) -> str:
    """A test id as code in a table cell (``md_cell``), fenced by more backticks than it holds."""
    text = md_cell(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table, every cell escaped (``md_cell``)."""
    return [*_md_head(list(map(md_cell, headers))), *(_md_row(map(md_cell, row)) for row in rows)]


def _md_row(cells: Iterable[str]) -> str:
    """A Markdown table's row of ``cells`` as they are."""
    return "| " + " | ".join(cells) + " |"


def ab_markdown_lines(ab: Sequence[Mapping[str, object]]) -> list[str]:
    """The Markdown summary's "A/B comparisons" section: per comparison its sides, the paired
    ratios, the output agreement and the budgets' outcomes (failing ones marked **FAIL**)."""
    if not ab:
        return []
    failed = sum(1 for e in ab if e.get("failures"))
    out = ["", "### A/B comparisons", "", f"{len(ab)} A/B comparison(s), {failed} failing a budget."]
    for e in ab:
        out += _ab_entry_lines(e)
    return out


def _ab_entry_lines(e: Mapping[str, Any]) -> list[str]:
    """One A/B comparison: its sides and pairs, the paired ratios, the output agreement, the budgets."""
    out = ["", f"#### `{e['test']}`: {ab_title(e)}", "", md_line(ab_pairs_line(e)) + "."]
    rows = ab_rows(e)
    if rows:
        out += ["", *_md_table(AB_HEADERS, rows)]
    agreement = agreement_rows(e)
    if agreement:
        out += ["", *_md_table(("output agreement", "value"), agreement)]
    budgets = ab_budget_lines(e)
    if budgets:
        out += [""] + [f"- **FAIL** {line}" if status.fails else f"- {line}" for status, line in budgets]
    return out


# --- one test's report parts, and the views of an outcome the reports show -------------------


def outcome_values(t: Outcome) -> dict[str, object]:
    """Name -> value of an outcome's flat figures: the measurement's, ``budget`` (``-``, ``ok``
    or ``FAIL key,key``), a load test's, then ``baseline`` (the verdict's short word)."""
    out: dict[str, object] = {}
    if t.figures is not None:
        out.update((name, getattr(t.figures, name)) for name in FIGURES)  # its typed fields, the catalog's order
        out["budget"] = t.budget.cell(t.breached_budgets)
        if t.figures.load is not None:
            out.update(dataclasses.asdict(t.figures.load))
    if t.verdict is not None:
        out["baseline"] = t.verdict.short
    return out


def junit_properties(t: Outcome) -> list[tuple[str, object]]:
    """``report.user_properties`` (JUnit XML): ``llmperf[label].<name>`` of ``outcome_values``,
    then ``verdict.<metric>`` of each comparison, ``part.<metric>.change``/``.ci``/``.moved`` of
    each part of a phase (``parts.part_properties``), and ``against`` (REF, when judged against
    ``--llmperf-against``'s)."""
    prefix = f"llmperf[{t.label}]." if t.label else "llmperf."
    out = [(prefix + k, v) for k, v in outcome_values(t).items()]
    if t.verdict is not None:
        out += [(f"{prefix}verdict.{c.metric}", c.verdict.value) for c in t.verdict.comparisons]
        out += part_properties(prefix, t.verdict.parts)
    if t.reference:
        out.append((prefix + "against", t.reference))
    prompt = t.prompt.to_json() if t.prompt is not None else {}
    out += [(f"{prefix}prompt.{k}", v) for k, v in prompt.items() if v is not None and k != "turns"]
    for turn in turns_of(t.prompt):  # a conversation's: one property per figure and turn
        out += [(f"{prefix}turn{turn.turn}.{k}", v) for k, v in turn.to_json().items() if k != "turn" and v is not None]
    return out


def summary_row(t: Outcome) -> dict[str, object]:
    """The terminal summary's row (``reports.text.summary_table``)."""
    return {"test": t.test, **outcome_values(t)}


def section_of(t: Outcome, columns: Sequence[str], width: int) -> tuple[str, str]:
    """The report section of one measurement (made in this process: ``t.measurement``): its
    figures, then its baseline comparison, then its undecided budgets."""
    assert t.measurement is not None  # live
    detail = metrics_table(t.measurement, width)
    if t.verdict is not None:
        detail += "\n\n" + "\n".join(wrap_text(line, width) for line in _verdict_lines(t, columns, width))
    if t.budget_notes:
        detail += "\n\n" + "\n".join(wrap_text(f"budget undecided: {line}", width) for line in t.budget_notes)
    return "llmperf" + (f" [{t.label}]" if t.label else ""), detail.rstrip()


def _verdict_lines(t: Outcome, columns: Sequence[str], width: int) -> list[str]:
    """What the baseline said: its note, what changed, the layers, the comparison table, where
    llama.cpp's time went (both sides' attribution passes) and its undecided comparisons."""
    v = t.verdict
    assert v is not None  # only a judged measurement has verdict lines
    shown = [dataclasses.replace(t, test=t.key)]
    table = comparison_table(shown, columns, width)
    # An error note is the test's failure line already: not a second copy here.
    lines = [v.note] if v.note and v.status != BaselineStatus.ERROR else []
    if v.changes:
        lines.append("changed since the baseline: " + ", ".join(v.changes))
    if v.layer_changes:
        slower = v.slower_layers
        lines.append(
            "slower layers: " + "; ".join(c.line() for c in slower)
            if slower
            else f"per-layer diff: no layer significantly slower ({len(v.layer_changes)} compared)"
        )
    where = v.attribution.lines() if v.attribution is not None else []  # under the table
    return lines + ([table] if table else []) + where + undecided_lines(shown)


@dataclass
class CallReport:
    """What the call phase's report gets: ``properties`` go on the item before the report is
    made (JUnit reads them from every later report), the rest on the report itself."""

    properties: list[tuple[str, object]] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # non-empty: the test fails with them
    #: The outcomes (``judge.result.Outcome``): in this process as they are; ``to_json()`` only where
    #: a report crosses pytest-xdist's wire (``pytest_plugin.plugin``'s report hooks).
    results: list[Outcome] = field(default_factory=list)
    ab: list[dict[str, object]] = field(default_factory=list)


def call_report(
    test: str,
    results: Sequence[Outcome],
    ab_results: Sequence[ABResult],
    *,
    columns: Sequence[str],
    width: int,
    budgets_gate: bool,
    failure_lines: Callable[[Outcome], list[str]],
    error: str | None = None,
) -> CallReport:
    """One test's measurements (after ``pytest_llmperf_result``) and A/B comparisons as report
    parts (``test``: its full id, ``core.formats.full_id``); ``failure_lines(outcome)``: the
    baseline's failure lines of one measurement; ``error``: the line the test already fails
    with (a hook's wrong answer, a failed measurement)."""
    out = CallReport(lines=[error] if error else [], results=list(results))
    if ab_results:
        out.ab = [  # the session JSON's entry of each A/B comparison
            {"test": test + (f"[{ab.label}]" if ab.label else ""), "nodeid": test, **ab_dict(ab)} for ab in ab_results
        ]
        out.properties += ab_properties(ab_results)
    for t in results:
        out.properties += junit_properties(t)
        out.sections.append(section_of(t, columns, width))
        out.lines += [t.failure.as_longrepr()] if t.failure is not None and budgets_gate else []
        out.lines += failure_lines(t)
    return out
