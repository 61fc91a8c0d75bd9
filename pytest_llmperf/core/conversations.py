"""A conversation as a test names it (the ``conversation`` marker key, ``llmperf.measure()``
keyword): a JSON file holding ``{"system": "...", "turns": ["...", "..."]}`` (``system``
optional) or just the list of user turns, or the same given inline. Read once, through the one
reader of user-given files (``documents.read_workload_file``: regular files only, its size limit), and
checked whole before anything is measured: a problem is one line naming the file (and the line
of a JSON syntax error, or the turn by its index). What a conversation is and how a run sends
it: ``core.workload.Conversation``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .documents import loads, read_workload_file
from .errors import ConfigError
from .workload import Conversation, conversation_of


def conversation(value: object) -> Conversation:
    """The conversation a test gives: a JSON file's path (str or path object), or inline."""
    if isinstance(value, (str, os.PathLike)):
        return read_conversation(Path(value))
    return conversation_of(value)


def read_conversation(path: Path) -> Conversation:
    """The conversation of the JSON file ``path``; a ConfigError naming the file."""
    return parse_conversation(
        read_workload_file(path, "conversation", "conversation (JSON)", "shorten the conversation"), str(path)
    )


def parse_conversation(text: str, source: str) -> Conversation:
    """JSON text's conversation; a ConfigError ``source:line: ...`` for a syntax error, else
    ``source: ...`` naming what is wrong."""
    try:
        value = loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}:{exc.lineno}: not JSON ({exc.msg})") from None
    except ValueError as exc:  # a key given twice
        raise ConfigError(f"{source}: not JSON ({exc})") from None
    try:
        return conversation_of(value)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
