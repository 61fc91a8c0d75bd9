"""User-facing errors: each carries a one-line message that says what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LLMPerfError(Exception):
    """A problem the user can fix (bad model path, bad marker key, context too small...).

    The plugin shows ``str(error)`` as a single line, without a traceback.
    """


class ConfigError(LLMPerfError):
    """Invalid configuration: options, ini settings, marker keys."""


class EngineError(LLMPerfError):
    """The engine could not load the model or run the workload."""


class NotSteppable(EngineError):
    """A run could not pause between its tokens (``engines.capabilities.SteppedRuns``): the
    engine computed while paused, or nothing shows that it did not. Runs of whole requests
    serve instead."""


class ToolBuildError(EngineError):
    """llama.cpp's own tools (llama-server, llama-bench) could not be built or found."""


def one_line(exc: BaseException) -> str:
    """An error as one line: its message where it is ours (``LLMPerfError``), else its type too
    (a bug in a worker thread, a task or a user's callable)."""
    return str(exc) if isinstance(exc, LLMPerfError) else f"{type(exc).__name__}: {exc}"


#: At most this many names are listed in full where a name was not one of them.
LISTED_NAMES = 10


def unknown_name(what: str, name: object, known: Iterable[str], where: str = "") -> str:
    """The one line for a name that is not one of ``known``: ``unknown llmperf marker key
    'peak_rss_mib'; did you mean 'max_rss_mib'?``. A close name is suggested (difflib); a few
    names are listed whole, many are not (``where`` says where to read them all)."""
    names = list(dict.fromkeys(known))
    line = f"unknown {what} {name!r}" + did_you_mean(name, names)
    close = bool(did_you_mean(name, names))
    if len(names) <= LISTED_NAMES:
        return line + f" ({'one of' if close else 'choose from'} {', '.join(names)})"
    return line + (f" ({len(names)} in all: see {where})" if where else "")


def did_you_mean(name: object, known: Iterable[str], prefix: str = "") -> str:
    """``; did you mean 'max_rss_mib'?`` for the names of ``known`` close to ``name``, else "";
    ``prefix``: what every name starts with (``llmperf_``), left out of the likeness."""
    tails = {k.removeprefix(prefix): k for k in known}
    close = [tails[t] for t in difflib.get_close_matches(str(name).removeprefix(prefix), list(tails), n=3, cutoff=0.6)]
    if not close:
        return ""
    named = [repr(c) for c in close]
    return f"; did you mean {', '.join(named[:-1]) + ' or ' if len(named) > 1 else ''}{named[-1]}?"


def closest_name(name: str, known: Iterable[str], cutoff: float = 0.8) -> str | None:
    """The one name of ``known`` closest to ``name`` (difflib), or None when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None
