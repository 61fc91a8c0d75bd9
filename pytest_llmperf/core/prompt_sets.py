"""A prompt set as a test names it (the ``prompt_set`` marker key, ``llmperf.measure()``
keyword): a JSONL file, one request a line (``{"prompt": ...}`` or ``{"messages": [...]}``,
optional ``max_tokens`` and ``weight``), or an inline list of the same objects. Read once,
through the one reader of user-given files (``documents.read_workload_file``: regular files only, its
size limit), and checked whole before anything is measured: a problem is one line naming the
file and line. What a request is and how runs draw from a set: ``core.workload``."""

from __future__ import annotations

import os
from pathlib import Path

from .documents import jsonl_values, read_workload_file
from .errors import ConfigError
from .workload import SetRequest, prompt_set_requests, read_each, set_request


def prompt_set(value: object) -> tuple[SetRequest, ...]:
    """The set a test gives: a JSONL file's path (str or path object) or an inline list."""
    if isinstance(value, (str, os.PathLike)):
        return read_prompt_set(Path(value))
    return prompt_set_requests(value)


def read_prompt_set(path: Path) -> tuple[SetRequest, ...]:
    """The requests of the JSONL file ``path``; a ConfigError naming the file (and the line)."""
    return parse_prompt_set(
        read_workload_file(path, "prompt set", "prompt set (JSONL)", "split the set or sample it"), str(path)
    )


def parse_prompt_set(text: str, source: str) -> tuple[SetRequest, ...]:
    """JSONL text's requests, one a line (blank lines skipped); a ConfigError ``source:line: ...``
    for the first bad line, or naming ``source`` when it holds no request."""
    requests = read_each(((f"{source}:{n}", value) for n, value in jsonl_values(text, source)), set_request)
    if not requests:
        raise ConfigError(f'prompt set {source} is empty: give one request a line, such as {{"prompt": "..."}}')
    return tuple(requests)
