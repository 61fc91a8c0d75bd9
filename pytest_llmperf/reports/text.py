"""Plain-text reports: the per-test metrics table and the session summary table, and the rows
of a served load level (load curve, the server's own figures, what serving adds).

Summary rows are ``reports.session_file.summary_row``: built from the typed outcomes that
cross pytest-xdist's wire (the JUnit properties come from the same outcome).

Where the time goes, as tables: per-layer times, the roofline, stability and memory.

Everything renders from the measurement as stored (``baselines.records.stored``: the Measurement
as its file holds it, its sections typed), so the test report's detail section, ``llmperf profile`` (text, Markdown)
and its JSON show the same figures."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..baselines.records import stored
from ..core import catalog
from ..core import formats as nodeids
from ..core.catalog import FIGURES, METRICS, SUMMARY_COLUMNS
from ..core.formats import cell, fmt, fmt_or, render_table
from ..core.measurement import LatencyStats, Measurement
from ..core.settings import DEFAULT_SUMMARY_COLUMNS

if TYPE_CHECKING:
    from ..core.measurement import (
        LayerProfile,
        LoadStats,
        Memory,
        ModelLoads,
        PhaseRoofline,
        PromptLengths,
        Roofline,
        ServerSide,
        Stability,
        TraceReplay,
    )


#: The latency metrics of a served load level (per-request percentiles in the load tables).
LOAD_METRICS = tuple(m for m in catalog.METRICS.values() if m.load_stat)


def _load_stat(s: LoadStats, metric: catalog.Metric) -> LatencyStats | None:
    """The load test's latency statistics of one of ``LOAD_METRICS`` (None: a level read from a
    file, which keeps its p50 and p99 only: ``_p50_p99``)."""
    assert metric.load_stat is not None
    stats: LatencyStats | None = getattr(s, metric.load_stat)
    return stats


def _p50_p99(s: LoadStats, metric: catalog.Metric) -> str:
    """``p50 / p99`` of one of ``LOAD_METRICS``: its statistics', else the stored figures (``-``: none)."""
    st = _load_stat(s, metric)
    if st is not None:
        return f"{fmt(st.p50_ms)} / {fmt(st.p99_ms)}"
    p50, p99 = (getattr(s, f"{metric.load_stat}_{p}_ms", None) for p in ("p50", "p99"))
    return f"{_dash(p50)} / {_dash(p99)}"


def _figure_row(m: Measurement, first: str, *more: str) -> tuple[str, str, str, str]:
    """A metrics-table row of catalog figures of one metric: ``TTFT median / p95``."""
    figures = [FIGURES[first], *(FIGURES[name] for name in more)]
    label = " / ".join([figures[0].label, *(f.statistic for f in figures[1:])])
    direct = catalog.direct_sample(figures[0].metric, m) if figures[0].metric else None
    sample = f"{m.itl.count} tokens" if figures[0].pooled_tokens else direct or f"{m.n_runs} runs"
    return label, figures[0].unit, " / ".join(fmt_or(f.number(m)) for f in figures), sample


#: The metrics table's rows of catalog figures, each named by its figures, in the table's order.
FIGURE_ROWS: tuple[tuple[str, ...], ...] = (
    ("ttft_ms", "ttft_p95_ms"),
    ("prefill_ms",),
    ("prefill_tps",),
    ("tpot_ms",),
    ("decode_tps",),
    ("e2e_ms",),
    ("itl_p50_ms", "itl_p90_ms"),
    ("itl_p95_ms", "itl_p99_ms"),
)


def figure_rows() -> dict[str, tuple[str, ...]]:
    """``FIGURE_ROWS`` by their first figure, with every other catalog figure of a metric: it
    joins the first row of its metric and sample (runs or pooled tokens), else it has a row of
    its own (after the ITL rows): a new catalog figure shows in the table."""
    rows = {r[0]: list(r) for r in FIGURE_ROWS}
    placed = {name for r in FIGURE_ROWS for name in r}
    for name, f in FIGURES.items():
        if f.metric is not None and name not in placed:
            same = (k for k in rows if (FIGURES[k].metric, FIGURES[k].pooled_tokens) == (f.metric, f.pooled_tokens))
            rows.setdefault(next(same, name), []).append(name)  # the figure's own row when none matches
    return {k: tuple(v) for k, v in rows.items()}


def _shown(m: Measurement, phase: str) -> bool:
    """A phase's rows where the measurement has them: fresh loads, the agreement with REF."""
    return {
        "startup": m.model_loads is not None,
        "agreement": m.agreement is not None,
        "delivery": m.delivered_items is not None,
    }.get(phase, True)


def metrics_table(m: Measurement, width: int | None = None) -> str:
    """The detail section of one measurement: every figure with its sample count; ``width``
    (a terminal's): its table's cells wrapped and its lines wrapped to fit it."""
    found = stored(m)
    rows = _timing_rows(m) + length_rows(found.prompt_lengths) + _serving_rows(m)
    if found.model_loads is not None:
        rows += load_state_rows(found.model_loads)
    assert found.stability is not None and found.memory is not None  # ``Measurement.of`` writes both
    rows += stability_rows(found.stability) + memory_rows(found.memory, figures=False)
    head = _engine_head(m) if width is None else wrap_text(_engine_head(m), width) + "\n"
    text = head + wrapped_table(("metric", "unit", "value", "sample"), rows, width)
    notes = [n for n in (parts_note(m), length_note(found.prompt_lengths), *m.token_notes) if n]
    text += "".join(f"\n{n}" if width is None else "\n" + wrap_text(n, width) for n in notes)
    return text + _breakdowns(m, found, width)


def _engine_head(m: Measurement) -> str:
    """What ran (engine, threads) and the workload: the two lines over the metrics table."""
    drives = f"; drove llama_cpp.Llama {', '.join(m.engine.llamas)}" if m.engine.llamas else ""
    prompt = (
        f"{m.prompt_tokens} prompt tokens"
        if m.prompt_tokens is not None
        else "a prompt whose tokens this engine does not count"
    )
    if m.prompt_lengths is not None:  # a prompt set: its runs' lengths vary
        sizes = m.prompt_lengths.buckets
        prompt = f"prompts within {sizes[0].low_tokens} to {sizes[-1].high_tokens} tokens (a prompt set)"
    runs = f"{m.n_runs} runs"
    w = m.asked
    if w.conversation is not None:  # a run is each of its turns (or the judged one); the prompt grows
        known = [t.prompt_tokens for t in m.turns if t.prompt_tokens is not None]
        prompt = (f"turn {w.turn} of " if w.turn is not None else "") + f"a conversation of {w.turns} turns"
        prompt += f", prompts {min(known)} to {max(known)} tokens" if len(set(known)) > 1 else ""
        prompt += f", {known[0]} prompt tokens" if len(set(known)) == 1 else ""
        if w.turn is None:
            runs = f"{m.n_runs} turns ({m.n_runs // w.turns} conversations)"
    return (
        f"{m.engine.engine}: {m.engine.describe()}"
        + (f"; threads {m.engine.threads}" if m.engine.threads is not None else "")
        + drives
        + "\n"
        f"workload: {prompt}, "
        f"{m.tokens_per_run} generated per run, {runs} (+{m.asked.warmup} warm-up discarded)\n"
    )


def _timing_rows(m: Measurement) -> list[tuple[str, str, str, str]]:
    """The metrics table's timings: the catalog's figure rows (``figure_rows``) with the parts of
    each phase between them (llama.cpp's own counters and the time outside llama.cpp, where the
    engine has them: ``parts_note`` says why not), then the inter-token latency's spread."""
    itl = m.itl
    runs = f"{m.n_runs} runs"
    by_first = figure_rows()
    prefill_parts, decode_parts = _part_rows(m) if has_parts(m) else ([], [])

    def row(first: str) -> tuple[str, str, str, str]:
        return _figure_row(m, *by_first[first])

    return [
        row("ttft_ms"),
        *_prompt_rows(m),
        ("tokenize median", "ms", fmt(m.tokenize_ms), runs),
        row("prefill_ms"),
        *prefill_parts,
        row("prefill_tps"),
        row("tpot_ms"),
        *decode_parts,
        row("decode_tps"),
        row("e2e_ms"),
        row("itl_p50_ms"),
        row("itl_p95_ms"),
        *(
            row(first)
            for first in list(by_first)[len(FIGURE_ROWS) :]
            if _shown(m, METRICS[FIGURES[first].metric or ""].phase)
        ),
        ("ITL mean +- stdev", "ms", f"{fmt(itl.mean_ms)} +- {fmt(itl.stdev_ms)}", f"{itl.count} tokens"),
        ("ITL CV", "", f"{itl.cv:.1%}", f"{itl.count} tokens"),
        ("ITL min / max", "ms", f"{fmt(itl.min_ms)} / {fmt(itl.max_ms)}", f"{itl.count} tokens"),
    ]


Row = tuple[str, str, str, str]


def has_parts(m: Measurement) -> bool:
    """The engine split some run's time into llama.cpp's own and the rest (native counters)."""
    return m.native_prefill_ms is not None or m.native_decode_ms_per_token is not None


def _part_rows(m: Measurement) -> tuple[list[Row], list[Row]]:
    """The parts of prefill (after the prefill row) and of decode per token (after TPOT)."""
    runs = f"{m.n_runs} runs"
    sampling = "" if m.engine.sample is None or m.engine.sample else ", timed apart"
    rows = [
        ("decode (llama.cpp) median", "ms/token", fmt_or(m.native_decode_ms_per_token), runs),
        ("engine overhead median", "ms/token", fmt_or(m.overhead_ms_per_token), runs),
        ("decode outside llama.cpp median", "ms/token", fmt_or(m.decode_outside_ms_per_token), runs),
        (
            "sampling (llama.cpp sampler)" + sampling,
            "ms/token",
            fmt_or(m.sampling_ms_per_token),
            runs if m.sampling_ms_per_token is not None else _untimed_sampling(m),
        ),
    ]
    if m.python_sampling_ms_per_token is not None:
        rows.append(
            ("logits processors / stopping criteria (Python)", "ms/token", fmt(m.python_sampling_ms_per_token), runs)
        )
    return [
        ("prefill (llama.cpp) median", "ms", fmt_or(m.native_prefill_ms), runs),
        ("prefill outside llama.cpp median", "ms", fmt_or(m.prefill_outside_ms), runs),
    ], rows


def _prompt_rows(m: Measurement) -> list[Row]:
    """A callable's prompt on a Llama the plugin sees: the cache state, the tokens llama.cpp
    evaluated and those it reused (its own counters); a conversation's figures turn by turn."""
    if m.asked.conversation is not None:
        return turn_rows(m)
    if m.prompt_reused_tokens is None:
        return []
    runs = f"{m.n_runs} runs"
    return [
        ("prompt cache", "", f"{m.asked.prompt_cache} (--llmperf-prompt-cache / prompt_cache)", ""),
        ("prompt tokens evaluated / reused", "tokens", f"{m.evaluated_prompt_tokens} / {m.prompt_reused_tokens}", runs),
    ]


def turn_rows(m: Measurement) -> list[Row]:
    """A conversation's figures per turn (``Measurement.turns``): the prompt's
    tokens llama.cpp evaluated and reused (its counters), TTFT p50 / p95, decode per token."""
    rows: list[Row] = []
    for t in m.turns:
        runs = f"{t.runs} runs"
        if t.evaluated_tokens is not None:
            tokens = (
                f"turn {t.turn} prompt tokens evaluated / reused",
                "tokens",
                f"{t.evaluated_tokens} / {t.reused_tokens}",
                runs,
            )
        else:
            tokens = (
                f"turn {t.turn} prompt tokens",
                "tokens",
                "not counted: the callable drove no llama_cpp.Llama of this process",
                "",
            )
        rows += [
            tokens,
            (f"turn {t.turn} TTFT p50 / p95", "ms", f"{fmt(t.ttft_p50_ms)} / {fmt(t.ttft_p95_ms)}", runs),
            (f"turn {t.turn} decode median", "ms/token", fmt(t.tpot_ms), runs),
        ]
    return rows


def _untimed_sampling(m: Measurement) -> str:
    """Where the sampling time lies when no counter timed it: a server counts it in its own
    decode time; llama-cpp-python's sampler (a callable's) runs between llama.cpp's calls."""
    return "not reported: inside the server's time" if m.engine.endpoint else "not timed: outside llama.cpp"


def parts_note(m: Measurement) -> str | None:
    """The one line a measurement without the parts of its phases gets instead of their rows."""
    if has_parts(m):
        return None
    if m.engine.engine == "callable":
        why = (
            "the callable drove no llama_cpp.Llama of this process (a remote client, another library); "
            "llama.cpp's own time cannot be split from it"
        )
    elif m.engine.endpoint:
        why = "the server sent no timings (llama-server's); its own time cannot be split from the client's"
    else:
        why = "the engine reports no llama.cpp counters"
    return f"parts: not measured: {why}"


def length_rows(lengths: PromptLengths | None) -> list[Row]:
    """Where the runs' prompts had different lengths (a prompt set; the record's
    ``prompt_lengths``): TTFT and prefill per prompt-length bucket, each with its runs, then the
    prefill per prompt token over all runs (a figure the engine does not see has no row:
    ``length_note`` says why)."""
    if lengths is None:
        return []
    rows: list[Row] = []
    for b in lengths.buckets:
        runs, name = f"{b.n_runs} runs", span_text(b.low_tokens, b.high_tokens)
        ttft = f"{fmt_or(b.ttft_p50_ms)} / {fmt_or(b.ttft_p95_ms)}"
        rows.append((f"TTFT median / p95, prompt {name} tokens", "ms", ttft, runs))
        if b.prefill_p50_ms is not None:
            rows.append((f"prefill median, prompt {name} tokens", "ms", fmt(b.prefill_p50_ms), runs))
    all_runs = f"{lengths.n_runs} runs"
    per_token = (
        ("prefill per prompt token median", lengths.ms_per_prompt_token, all_runs),
        ("prefill per prompt token (llama.cpp) median", lengths.native_ms_per_prompt_token, all_runs),
        (
            "prefill per prompt token (slope of a fitted line)",
            lengths.slope_ms_per_token,
            f"{all_runs}, {len(lengths.buckets)} buckets",
        ),
    )
    return rows + [(label, "ms/token", fmt(value), sample) for label, value, sample in per_token if value is not None]


def span_text(low: int, high: int) -> str:
    """``64`` for one value (a prompt length, a count of pairs), ``64-127`` for a range."""
    return str(low) if low == high else f"{low}-{high}"


def length_note(lengths: PromptLengths | None) -> str | None:
    """The line a measurement by prompt length gets for its rule, and for a prefill it cannot see."""
    if lengths is None:
        return None
    note = f"by prompt length: {lengths.rule}"
    if lengths.ms_per_prompt_token is None:
        note += "; prefill per prompt token: not measured: the engine does not see where the prefill ends"
    return note


def _serving_rows(m: Measurement) -> list[tuple[str, str, str, str]]:
    """A load level's rows, the served prompt cache, and this engine's model load."""
    rows = load_rows(m) if m.load is not None else []
    if m.engine.endpoint:  # served: what the server's prompt cache was allowed to do
        rows.append(("prompt cache", "", m.asked.served_cache_note, ""))
    loads = (("model load (wall)", m.engine.load_ms), ("model load (llama.cpp)", m.engine.native_load_ms))
    return rows + [(label, "ms", fmt(ms), "this engine's 1 load") for label, ms in loads if ms is not None]


def _breakdowns(m: Measurement, found: Measurement, width: int | None = None) -> str:
    """What follows the metrics table: per-layer time, the roofline, the agreement with REF,
    the stability warnings; ``width``: tables and lines fitted to it."""
    text = ""
    if found.layers is not None:
        text += "\n\nper-layer time:\n" + layers_text(found.layers, width=width)
    if found.roofline is not None:
        text += "\n\nroofline:\n" + roofline_text(found.roofline, width=width)
    prose = list(m.agreement.against_lines()) if m.agreement is not None else []  # A is REF, B this tree
    warnings = list(found.stability.warnings) if found.stability is not None else []
    for block in (prose, warnings):
        if block:
            text += "\n\n" + "\n".join(block if width is None else [wrap_text(line, width) for line in block])
    return text


#: A test id is never cut shorter than this, whatever the width.
MIN_TEST_WIDTH = 16


def summary_table(
    rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None, width: int | None = None
) -> str:
    """The session summary. ``width`` (a terminal's): only ``columns`` (default
    ``DEFAULT_SUMMARY_COLUMNS``), test ids shortened to fit; None: every column, full ids."""
    chosen = list(SUMMARY_COLUMNS) if width is None else _summary_columns(columns)
    headers = [h for _, h, _ in chosen]
    body = [[cell(r.get(f), "n/a") for _, _, f in chosen] for r in rows]
    return render_table(headers, body) if width is None else fit_table(headers, body, width)


def _summary_columns(columns: Sequence[str] | None) -> list[tuple[str, str, str]]:
    """The test column, then ``columns`` in the order given (unknown names dropped; none:
    ``DEFAULT_SUMMARY_COLUMNS``)."""
    by_name = {col[0]: col for col in SUMMARY_COLUMNS}
    wanted = [c for c in (columns or ()) if c in by_name and c != "test"] or list(DEFAULT_SUMMARY_COLUMNS)
    return [SUMMARY_COLUMNS[0]] + [by_name[name] for name in dict.fromkeys(wanted)]


def short_ids(ids: Sequence[str]) -> dict[str, str]:
    """Each test id without what all of them share: the path, then the module when the rest
    is unique (``tests/perf/test_a.py::test_decode[#2]`` -> ``test_decode[#2]``); ids that
    still collide keep as many folders as tell them apart (``one/test_a.py::test_x`` and
    ``two/test_a.py::test_x``)."""

    def tail(nodeid: str, n: int) -> str:
        head, *pieces = nodeids.parts(nodeid)  # a parameter id's own "::" is no separator
        if not pieces:
            return nodeid
        if n > len(pieces):
            folders = head.split("/")
            return "/".join(folders[-(n - len(pieces)) :]) + "::" + "::".join(pieces)
        return "::".join(pieces[-n:])

    unique = list(dict.fromkeys(ids))
    deepest = max((len(nodeids.parts(i)) + i.count("/") for i in unique), default=1)
    for parts in range(1, deepest + 1):
        short = {i: tail(i, parts) for i in unique}
        if len(set(short.values())) == len(unique):
            return short
    return {i: i for i in unique}


def _clip(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters (the ends say the most); a
    parameter id (``[...]``) is kept whole when it leaves room for 6 characters of the name."""
    if len(text) <= width:
        return text
    name, bracket, param = text.partition("[")
    if bracket and len(param) + 1 <= width - 6:
        return _clip(name, width - len(param) - 1) + bracket + param
    keep = width - 2
    return text[: keep - keep // 2] + ".." + text[len(text) - keep // 2 :]


def distinct_clips(names: Sequence[str], width: int) -> dict[str, str] | None:
    """Each name cut to ``width`` (``_clip``), or None when two distinct names would read alike
    (a user could not tell their rows apart) or ``width`` leaves too little of a name."""
    unique = list(dict.fromkeys(names))
    if width < MIN_TEST_WIDTH and any(len(n) > width for n in unique):
        return None
    clipped = {n: _clip(n, width) for n in unique}
    return clipped if len(set(clipped.values())) == len(unique) else None


def _widest(text: str) -> int:
    return max(map(len, text.splitlines()), default=0)


def fit_table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, keyed: bool = True) -> str:
    """``render_table`` within ``width`` columns. The first column holds test ids: shortened
    (``short_ids``), then cut in the middle where every cut id still reads apart from the
    others; else the rows are numbered and the ids listed whole under the table (a numbered
    key), so no two tests ever look alike. Columns that still do not fit go to a second block
    of the table (each block led by the test column). ``keyed=False``: "" where the ids alone
    cannot make it fit (the caller then shows fewer columns)."""
    short = short_ids([r[0] for r in rows])
    table = [[short[r[0]], *r[1:]] for r in rows]
    whole = render_table(headers, table)
    if _widest(whole) <= width:
        return whole
    others = sum(max(len(str(c)) for c in col) + 2 for col in list(zip(headers, *table))[1:])
    clipped = distinct_clips([r[0] for r in table], max(width - others, len(headers[0])))
    if clipped is not None and _widest(render_table(headers, [[clipped[r[0]], *r[1:]] for r in table])) <= width:
        return render_table(headers, [[clipped[r[0]], *r[1:]] for r in table])
    if not keyed:
        return ""
    numbers = {name: str(i) for i, name in enumerate(dict.fromkeys(r[0] for r in table), 1)}
    numbered = [[numbers[r[0]], *r[1:]] for r in table]
    digits = len(str(len(numbers)))
    key = [line for name, n in numbers.items() for line in _key_lines(n.rjust(digits), name, width)]
    return wrapped_table(["#", *headers[1:]], numbered, width) + "\n" + "\n".join(key)


def _key_lines(number: str, name: str, width: int) -> list[str]:
    """``1: tests/a/test_x.py::test_f``: a numbered key's entry, the id whole, continued on
    indented lines where it is longer than the width."""
    room = max(width - len(number) - 2, 1)
    chunks = [name[i : i + room] for i in range(0, len(name), room)] or [""]
    return [f"{number}: {chunks[0]}", *(" " * (len(number) + 2) + c for c in chunks[1:])]


def wrap(text: str, width: int, indent: str = "    ") -> list[str]:
    """A line of prose (a verdict, a note, a why line) wrapped at ``width`` with a hanging
    ``indent`` (after the line's own); a word longer than a line (a path) is broken, never
    left past the edge."""
    if len(text) <= width:
        return [text]
    lead = text[: len(text) - len(text.lstrip(" "))]
    hanging = (lead + indent)[: max(width // 2, 0)]
    return textwrap.wrap(text, width, subsequent_indent=hanging, break_on_hyphens=False, break_long_words=True) or [
        text[:width]
    ]


#: A wrapped table column is never narrower than this, nor than its longest word.
MIN_CELL_WIDTH = 8


def wrapped_table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None) -> str:
    """``render_table``, with the widest cells (and headers) wrapped onto more lines (the row
    continues on them) until the table is at most ``width`` characters wide; when even that
    cannot fit, the columns split into blocks, each led by the first column. None: as
    ``render_table``."""
    table = [[str(c) for c in r] for r in rows]
    plain = render_table(headers, table)
    if width is None or _widest(plain) <= width:
        return plain
    widths = [max(len(c) for c in col) for col in zip(headers, *table)]
    floors = [
        min(w, max(MIN_CELL_WIDTH, *map(len, " ".join(col).split()))) for w, col in zip(widths, zip(headers, *table))
    ]
    if sum(floors) + 2 * (len(floors) - 1) > width and len(headers) > 2:
        return "\n\n".join(wrapped_table(h, r, width) for h, r in _split_columns(headers, table, floors, width))
    while sum(widths) + 2 * (len(widths) - 1) > width:
        i = max(range(len(widths)), key=lambda j: widths[j] - floors[j])
        if widths[i] <= floors[i]:
            break  # nothing left to narrow: one column and its floor are wider than the terminal
        widths[i] -= 1
    head = [_cell_lines(h, w) for h, w in zip(headers, widths)]
    cells = [[_cell_lines(c, w) for c, w in zip(r, widths)] for r in table]
    widths = [max(len(x) for row in [head, *cells] for x in row[j]) for j in range(len(headers))]

    def lines(row: Sequence[Sequence[str]]) -> list[str]:
        depth = max(len(c) for c in row)
        out = []
        for k in range(depth):
            first, *rest = (c[k] if k < len(c) else "" for c in row)
            out.append("  ".join([first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(rest, widths[1:]))]).rstrip())
        return out

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([*lines(head), rule, *(x for row in cells for x in lines(row))])


def _split_columns(
    headers: Sequence[str], rows: Sequence[Sequence[str]], floors: Sequence[int], width: int
) -> list[tuple[list[str], list[list[str]]]]:
    """The columns after the first in groups whose narrowest layout fits ``width`` beside the
    first column (at least one column each)."""
    groups: list[list[int]] = [[]]
    used = floors[0]
    for i in range(1, len(headers)):
        if groups[-1] and used + 2 + floors[i] > width:
            groups.append([])
            used = floors[0]
        groups[-1].append(i)
        used += 2 + floors[i]
    return [([headers[0], *(headers[i] for i in g)], [[r[0], *(r[i] for i in g)] for r in rows]) for g in groups]


def _cell_lines(text: str, width: int) -> list[str]:
    """A cell's text on lines of at most ``width`` characters (a continuation indented)."""
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent=" ", break_on_hyphens=False) or [""]


def wrap_text(text: str, width: int, indent: str = "    ") -> str:
    """Every line of ``text`` wrapped (``wrap``); blank lines kept."""
    return "\n".join(w for line in text.splitlines() for w in (wrap(line, width, indent) if line else [""]))


def curve_table(measurements: Sequence[Measurement], width: int | None = None) -> str:
    """One row per load level: throughput against per-request latency percentiles; ``width``:
    fitted to a terminal that wide (``wrapped_table``)."""

    rows = []
    for m in measurements:
        s = m.load
        assert s is not None  # a load level's measurement
        rows.append(
            [
                str(s.concurrency) + (f" @{s.rate_per_s:g}/s" if s.rate_per_s else ""),
                f"{s.n_ok}/{s.n_requests}",
                fmt(s.requests_per_s),
                fmt(s.output_tps),
                _dash(s.output_tps_per_request),
                *(_p50_p99(s, x) for x in LOAD_METRICS),
                f"{s.goodput:.0%}" if s.slo else "-",
            ]
        )
    fixed = ("concurrency", "ok", "req/s", "out tok/s", "tok/s per req")
    headers = (*fixed, *(f"{x.label} p50/p99 {x.unit}" for x in LOAD_METRICS), catalog.METRICS["goodput"].label)
    return wrapped_table(headers, rows, width)


def load_rows(m: Measurement) -> list[tuple[str, str, str, str]]:
    """Rows for the per-test metrics table (same columns as ``metrics_table``)."""
    s = m.load
    assert s is not None  # called for a load test's measurement

    def pct(metric: catalog.Metric) -> str:
        st = _load_stat(s, metric)
        if st is None:  # read from a file: its p50 and p99 only
            return _p50_p99(s, metric)
        return f"{fmt(st.p50_ms)} / {fmt(st.p90_ms)} / {fmt(st.p95_ms)} / {fmt(st.p99_ms)}"

    reqs = f"{s.n_ok} requests"
    pace = f", Poisson {s.rate_per_s:g}/s" if s.rate_per_s else ""
    rows = [
        ("load", "", "trace replay, open loop" if s.trace else f"concurrency {s.concurrency}{pace}", ""),
        *trace_rows(s.trace),
        ("requests ok / failed", "", f"{s.n_ok} / {s.n_failed}", f"{s.n_requests} requests"),
        *((f"{x.label} p50/p90/p95/p99", x.unit, pct(x), reqs) for x in LOAD_METRICS),
        ("output tokens/s overall", "t/s", fmt(s.output_tps), f"{_dash(s.duration_s)} s"),
        ("output tokens/s per request", "t/s", _dash(s.output_tps_per_request), reqs),
        ("requests/s", "req/s", fmt(s.requests_per_s), f"{_dash(s.duration_s)} s"),
    ]
    goodput, share = catalog.METRICS["goodput"].label, f"{s.goodput:.1%}"
    if s.slo:
        slo = ", ".join(f"{k} <= {fmt(v)}" for k, v in s.slo.items())
        rows.append((goodput, "", f"{share} ({slo})", f"{s.n_requests} requests"))
    else:
        rows.append((f"{goodput} (no SLO: requests that succeeded)", "", share, f"{s.n_requests} requests"))
    return rows + server_rows(s.server)


#: ``trace_rows``' row of the schedule's length (the HTML report's trace table has none).


def trace_rows(trace: TraceReplay | None, *, schedule: bool = True) -> list[tuple[str, str, str, str]]:
    """A trace replay's length and pace, and how late the client sent its requests against
    their schedule (the client's own lag): rows for the per-test table (``schedule``: with the
    span the schedule asked for, which the HTML table leaves out)."""
    if trace is None:
        return []
    n = f"{trace.n_requests} requests"
    lag = f"{fmt(trace.send_lag_p50_ms)} / {fmt(trace.send_lag_max_ms)}"
    return [
        ("trace", "", f"{trace.n_requests} requests over {fmt(trace.span_s)} s", f"replayed at {trace.speed:g}x"),
        *([("trace replayed over", "s", fmt(trace.scheduled_s[-1]), n)] if schedule and trace.scheduled_s else []),
        ("client send lag p50 / max (sent - scheduled)", "ms", lag, n),
    ]


def _dash(value: float | None) -> str:
    return fmt_or(value, "-")


def server_rows(server: ServerSide | None) -> list[tuple[str, str, str, str]]:
    """The server's own figures beside the client's: rows for the per-test table (same columns
    as ``metrics_table``)."""
    if server is None:
        return []

    reqs = f"{server.n_timed} requests"
    out = []
    if server.n_timed:
        out += [
            (
                "server prompt tokens evaluated min/p50/max",
                "tokens",
                f"{server.prompt_n_min} / {_dash(server.prompt_n_median)} / {server.prompt_n_max}",
                f"prompt {_dash(server.prompt_tokens_median)} tokens",
            ),
            ("prompt tokens the server took from its cache", "tokens", _dash(server.prompt_tokens_from_cache), reqs),
            ("server prompt time p50 (timings)", "ms", _dash(server.server_prompt_ms_p50), reqs),
            ("client TTFT - server prompt time p50", "ms", _dash(server.ttft_gap_ms_p50), reqs),
            ("server time per token p50 (timings)", "ms", _dash(server.server_ms_per_token_p50), reqs),
            ("client TPOT - server time per token p50", "ms", _dash(server.tpot_gap_ms_p50), reqs),
        ]
    m = server.metrics or {}
    if "prompt_tokens_total" in m and "tokens_predicted_total" in m:
        tokens = f"{m['prompt_tokens_total']:.0f} / {m['tokens_predicted_total']:.0f}"
        out.append(("server /metrics: prompt / generated tokens", "tokens", tokens, "this level"))
    if server.tokens_per_decode is not None:
        calls = f"{m['n_decode_total']:.0f} decode calls"
        out.append(("server /metrics: tokens per decode call", "", fmt(server.tokens_per_decode), calls))
    return out


def curve_lines(measurements: Sequence[Measurement]) -> list[str]:
    """One line per load level with the server's own figures beside the client's."""

    out = []
    for m in measurements:
        load = m.load
        s = load.server if load is not None else None
        if load is None or s is None:
            continue
        parts = []
        if s.n_timed:
            parts += [
                f"server evaluated {_dash(s.prompt_n_median)} of {_dash(s.prompt_tokens_median)} prompt tokens (p50), "
                f"{_dash(s.prompt_tokens_from_cache)} from its cache in all",
                f"TTFT - server prompt {_dash(s.ttft_gap_ms_p50)} ms",
                f"TPOT {_dash(load.tpot_p50_ms)} vs server {_dash(s.server_ms_per_token_p50)} ms/token",
            ]
        if s.tokens_per_decode is not None:
            parts.append(f"{fmt(s.tokens_per_decode)} tokens per decode call")
        out.append(f"server side, concurrency {load.concurrency}: " + "; ".join(parts))
    return out


def overhead_lines(rows: Iterable[Mapping[str, object]]) -> list[str]:
    """What serving adds: one line per test with both an in-process and an ``http`` measurement
    (report rows) in the session summary: both TTFT and TPOT medians and the server's added
    latency per token (TPOT served minus TPOT in process), the figure users ask for."""
    ttft, tpot = METRICS["ttft_ms"], METRICS["tpot_ms"]
    by_test: dict[str, list[Mapping[str, Any]]] = defaultdict(list)  # by test function: the id without parameters
    for row in rows:
        by_test[str(row.get("test", "")).split("[", 1)[0]].append(row)
    lines = []
    for test, group in by_test.items():
        local = [r for r in group if r.get("engine") == "llama.cpp" and r.get(tpot.name) is not None]
        served = [r for r in group if str(r.get("engine", "")).startswith("http") and r.get(tpot.name) is not None]
        if local and served:
            a, b = local[0], served[0]
            lines.append(
                f"{test}: in process {_ttft_tpot(a)}; served {_ttft_tpot(b)}; server overhead "
                f"{b[tpot.name] - a[tpot.name]:+.3g} {tpot.unit}/token, "
                f"{b[ttft.name] - a[ttft.name]:+.3g} {ttft.unit} {ttft.label}"
            )
    return lines


def _ttft_tpot(r: Mapping[str, Any]) -> str:
    """``TTFT 7.85 ms, TPOT 1.12 ms``: a summary row's two medians."""
    return ", ".join(f"{x.label} {fmt(r[x.name])} {x.unit}" for x in (METRICS["ttft_ms"], METRICS["tpot_ms"]))


BAR_WIDTH = 24


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def _bar(share: float, widest: float, markdown: bool) -> str:
    n = round(BAR_WIDTH * share / widest) if widest else 0
    return ("█" if markdown else "#") * n


def layer_rows(layers: LayerProfile, markdown: bool = False) -> tuple[list[str], list[list[str]]]:
    """One row per segment: prefill and decode median ms and share, a bar of the decode share,
    and OUTLIER where the robust rule flags it."""
    pre, dec = layers.prefill, layers.decode
    widest = max(dec.share) if dec.share else 0.0
    outliers = set(pre.outliers) | set(dec.outliers)
    rows = [
        [name, fmt(pre.median_ms[i]), f"{pre.share[i]:.1%}", fmt(dec.median_ms[i]), f"{dec.share[i]:.1%}"]
        + [_bar(dec.share[i], widest, markdown), "OUTLIER" if name in outliers else ""]
        for i, name in enumerate(dec.names)
    ]
    return ["segment", "prefill ms", "share", "decode ms/token", "share", "decode share", "flag"], rows


def layer_summary(layers: LayerProfile) -> list[str]:
    lines = [
        f"{p.phase}: {len(p.names) - 1} layers + output head cover {p.coverage:.1%} of the "
        f"instrumented step (median over {p.n_steps} steps in {p.n_runs} runs; step median "
        f"{fmt(p.step_ms)} ms, segment medians sum to {fmt(sum(p.median_ms))} ms)"
        for p in (layers.prefill, layers.decode)
    ]
    pairs = (("prefill", layers.prefill_overhead_ratio), ("decode", layers.decode_overhead_ratio))
    ratios = [f"{name} {ratio:.3f}x" for name, ratio in pairs if ratio is not None]
    if ratios:
        lines.append(
            "instrumentation cost (instrumented / plain, interleaved runs; prefill time, TPOT): " + ", ".join(ratios)
        )
    lines.append(f"outlier rule: {layers.outlier_rule}")
    return lines


def layers_text(layers: LayerProfile, markdown: bool = False, width: int | None = None) -> str:
    headers, rows = layer_rows(layers, markdown)
    return _table_with_notes(headers, rows, layer_summary(layers), markdown, width)


def _table_with_notes(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    notes: Sequence[str],
    markdown: bool,
    width: int | None = None,
) -> str:
    """A table and its notes under it (Markdown: the notes as a list after a blank line);
    ``width`` (a terminal's): the table's cells and the notes wrapped to it."""
    if markdown:
        return markdown_table(headers, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
    notes = notes if width is None else [wrap_text(n, width) for n in notes]
    return wrapped_table(headers, rows, width) + "\n" + "\n".join(notes)


def roofline_text(roof: Roofline, markdown: bool = False, width: int | None = None) -> str:
    headers = ["phase", "verdict", "FLOP/byte", "bound t/s", "achieved t/s", "achieved GB/s", "MBU", "MFU"]
    rows = [_roofline_row(p) for p in _roofline_phases(roof)]
    return _table_with_notes(headers, rows, _roofline_notes(roof), markdown, width)


def _roofline_phases(roof: Roofline) -> list[PhaseRoofline]:
    """The phases the roofline has, prefill first."""
    return [p for p in (roof.prefill, roof.decode) if p is not None]


def _roofline_row(p: PhaseRoofline) -> list[str]:
    """One phase's roofline: its bound, intensity, achieved rate and bandwidth, MBU and MFU."""
    return [
        p.phase,
        p.verdict,
        fmt(p.intensity_flop_per_byte),
        fmt(p.bound_tps),
        fmt(p.achieved_tps),
        fmt(p.achieved_bw_gbs),
        "n/a" if p.note else f"{p.mbu:.2f}",
        f"{p.mfu:.2f}",
    ]


def _roofline_notes(roof: Roofline) -> list[str]:
    """The machine's peaks and balance, and each phase's note."""
    bw, fl = roof.peak_bw, roof.peak_tflops
    return [
        f"peak bandwidth {fmt(bw.value)} GB/s ({bw.source}" + (f": {bw.detail})" if bw.detail else ")"),
        f"peak compute {fmt(fl.value * 1e3)} GFLOP/s ({fl.source}" + (f": {fl.detail})" if fl.detail else ")"),
        f"machine balance {fmt(roof.machine_balance_flop_per_byte)} FLOP/byte; below it a phase is "
        f"memory-bound; decode at mean context {fmt(roof.context_tokens)} tokens",
    ] + [f"{p.phase}: {p.note}" for p in _roofline_phases(roof) if p.note]


def stability_rows(stab: Stability) -> list[tuple[str, str, str, str]]:
    n = f"{stab.n_runs} runs"
    rows = [
        ("TPOT CV / spread", "", f"{stab.tpot_cv:.1%} / {stab.tpot_spread_pct:.1f}%", n),
        ("TTFT CV", "", f"{stab.ttft_cv:.1%}", n),
        ("first token / median ITL", "x", f"{stab.first_token_slowdown:.2f}", n),
    ]
    if stab.first_run_slowdown is not None:
        rows.append(("warm-up run / median TPOT", "x", f"{stab.first_run_slowdown:.2f}", "1 warm-up run"))
    slope, span = stab.context_slope_us_per_token, stab.context_span
    if slope is not None and span is not None:
        rows.append(("ITL slope vs context", "us/token", f"{slope:+.3g}", f"positions {span[0]}-{span[1]}"))
    return rows


def load_state_rows(loads: ModelLoads, figures: bool = False) -> list[tuple[str, str, str, str]]:
    """A record's fresh model loads (``model_loads``): what they were and how that was checked;
    ``figures``: with the load and fresh-engine TTFT medians."""
    n = len(loads.samples)
    rows = []
    if figures:
        rows += [
            ("model load median", "ms", fmt_or(loads.load_ms), f"{n} loads, {loads.page_cache}"),
            ("fresh-engine TTFT median", "ms", fmt_or(loads.fresh_ttft_ms), f"{n} loads"),
        ]
    rows.append(("fresh model loads", "", loads.page_cache, f"{n} loads; {loads.evidence}"))
    if loads.note:
        rows.append(("", "", "cold asked", loads.note))
    return rows


def memory_rows(memory: Memory, figures: bool = True) -> list[tuple[str, str, str, str]]:
    """A record's memory, each figure with its source; ``figures=False``: without the catalog's
    memory figures (the metrics table shows them as figure rows)."""
    return [
        (label, "MiB", fmt(value / 2**20 if in_bytes else value), source(memory))
        for key, label, in_bytes, figure, source in MEMORY_ROWS
        if isinstance(value := getattr(memory, key), (int, float)) and (figures or not figure)
    ]


def _rss_scope(memory: Memory) -> str:
    return "during the runs" if memory.peak_rss_scope == "measurement" else "process lifetime"


def _buffer_source(memory: Memory) -> str:
    return memory.buffer_source or ""


#: ``memory_rows``' rows in order: (the record's memory key, label, in bytes (shown in MiB), a
#: catalog figure (the metrics table shows those as figure rows), where the figure comes from).
MEMORY_ROWS: tuple[tuple[str, str, bool, bool, Callable[[Memory], str]], ...] = (
    ("peak_rss_bytes", "peak RSS", True, True, _rss_scope),
    ("kv_mib", "KV buffer", False, True, _buffer_source),
    ("compute_mib", "compute buffer", False, True, _buffer_source),
    ("output_mib", "output buffer", False, False, _buffer_source),
    ("model_buffer_mib", "model buffer", False, True, _buffer_source),
    ("mapped_mib", "model file mapping", False, True, lambda _: "/proc/self/smaps"),
    ("mapped_resident_mib", "model file mapping resident", False, False, lambda _: "smaps, after load"),
    ("kv_cache_bytes", "KV cache (whole context)", True, False, lambda _: "computed from the shape"),
)
