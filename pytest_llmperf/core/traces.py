"""A trace as a test names it (the ``trace`` marker key, ``llmperf.measure()`` keyword): a JSONL
file, one request a line with its arrival time (``{"t_s": 0.25, "prompt": ...}`` or
``{"t_s": 0.25, "messages": [...]}``, optional ``max_tokens``), or an inline list of the same
objects; and the same file written from a session's served requests (``trace_text``). Read once,
through the one reader of user-given files (``documents.read_workload_file``: regular files only, its size
limit), and checked whole before anything is measured: a problem is one line naming the file and
line. Arrival times are numbers of seconds >= 0, never going backwards (a trace is replayed in its
order, never re-sorted). What a line is and how a trace is replayed: ``core.workload``
(``TraceRequest``) and ``measuring.served``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .documents import jsonl_values, read_workload_file
from .errors import ConfigError
from .workload import TraceRequest, check_arrival, read_each, trace_request, trace_requests


def trace(value: object) -> tuple[TraceRequest, ...]:
    """The trace a test gives: a JSONL file's path (str or path object) or an inline list."""
    if isinstance(value, (str, os.PathLike)):
        return read_trace(Path(value))
    return trace_requests(value)


def read_trace(path: Path) -> tuple[TraceRequest, ...]:
    """The lines of the JSONL file ``path``; a ConfigError naming the file (and the line)."""
    return parse_trace(
        read_workload_file(path, "trace", "trace (JSONL)", "split the trace or replay a part of it"), str(path)
    )


def parse_trace(text: str, source: str) -> tuple[TraceRequest, ...]:
    """JSONL text's requests, one a line (blank lines skipped); a ConfigError ``source:line: ...``
    for the first bad line, or naming ``source`` when it holds no request."""
    lines = read_each(
        ((f"{source}:{n}", value) for n, value in jsonl_values(text, source)), trace_request, check_arrival
    )
    if not lines:
        raise ConfigError(f'trace {source} is empty: give one request a line, such as {{"t_s": 0.0, "prompt": "..."}}')
    return tuple(lines)


def trace_text(lines: tuple[TraceRequest, ...] | list[TraceRequest]) -> str:
    """A trace's JSONL text, one line per request (``parse_trace`` reads it back)."""
    return "".join(json.dumps(r.to_line(), ensure_ascii=False) + "\n" for r in lines)
