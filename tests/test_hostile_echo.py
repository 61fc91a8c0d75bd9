"""Bytes from other processes (a server, REF's pytest session, llama.cpp's log, git, a
server's stderr) are quoted escaped wherever a message echoes them: an ESC, a carriage
return, a bell, a bidirectional override act on the reader's terminal, so they show as
``\\x1b``, ``\\r``, ``\\x07``, ``\\u202e``. One helper (``core.formats.escaped``) at each
place such text enters a message; each place is a case below."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmperf.core.formats import escaped

#: What a hostile or careless process may write: colour, a title change, overwrite, bell, bidi.
HOSTILE = "boom \x1b[31mred\x1b[0m \x1b]0;title\x07 over\rwrite \x08 \u202eevil\u202c \x9b end"
#: What no echoed text may carry.
RAW = ("\x1b", "\r", "\x07", "\x08", "\u202e", "\x9b")


def test_escaped_writes_each_control_character_as_its_escape_and_keeps_the_rest() -> None:
    assert escaped(HOSTILE) == (
        "boom \\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 over\\rwrite \\x08 \\u202eevil\\u202c \\x9b end"
    )
    assert escaped("plain text, é ü 日本, tabs\tand\nlines") == "plain text, é ü 日本, tabs\\tand\\nlines"


def _quoted_log(text: str) -> str:
    from pytest_llmperf.engines.llama_cpp_native import quoted_log

    return " | ".join(quoted_log(text))


def _refs_last_line(text: str) -> str:
    from pytest_llmperf.session.refs import _last_line

    return _last_line(text)


def _server_tail(text: str, tmp_path: Path) -> str:
    from pytest_llmperf.engines.servers import _tail

    log = tmp_path / "stderr.log"
    log.write_text(text)
    return _tail(log)


def _sse_error(text: str) -> str:
    import json

    from pytest_llmperf.core.errors import EngineError
    from pytest_llmperf.engines.sse import parse_event

    with pytest.raises(EngineError) as caught:
        parse_event(json.dumps({"error": {"message": text}}), "http://127.0.0.1:1/v1")
    return str(caught.value)


def _http_status(text: str) -> str:
    from pytest_llmperf.engines.sse import status_error

    return str(status_error("http://127.0.0.1:1/v1", 500, text.encode(), None))


def _side_event(ev: str):
    def line(text: str) -> str:
        from pytest_llmperf.session.sides import event_of

        return str(event_of({"ev": ev, "line": text, "outcome": "failed", "reports": []}).line)

    return line


ECHOES = {
    "llama.cpp / a side's log lines": _quoted_log,
    "git's and REF's python's stderr": _refs_last_line,
    "a server's stderr": _server_tail,
    "a server's error event": _sse_error,
    "a server's error body": _http_status,
    **{f"a side's {ev} line": _side_event(ev) for ev in ("error", "unstepped", "logits", "attribution", "report")},
}


@pytest.mark.parametrize("where", list(ECHOES))
def test_text_from_another_process_is_echoed_escaped(where, tmp_path: Path) -> None:
    echo = ECHOES[where]
    shown = echo(HOSTILE, tmp_path) if where == "a server's stderr" else echo(HOSTILE)
    assert not any(c in shown for c in RAW), repr(shown)
    assert "\\u202eevil" in shown, shown  # what it sent, shown, not dropped
