"""One streamed completion, parsed: server-sent event lines in, a RunTrace out.

Shared by the synchronous and the asynchronous HTTP clients (engines/http.py), so both apply
the same checks. What a server sends is untrusted: lines are size-capped, events must be JSON
objects, counts must be plausible.

Token counts, in order of trust: the server's ``usage.completion_tokens``; llama-server's
``timings.predicted_n``; ``max_tokens`` when the server stopped with ``finish_reason="length"``;
else the events. llama-server's ``timings`` (prompt_n, prompt_ms, predicted_n, predicted_ms)
become the run's ``NativeCounters``: the server's own clock beside ours, as llama.cpp's
counters are for the in-process engine.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeGuard

from ..core.documents import DuplicateKey, JSONValue, loads
from ..core.errors import EngineError
from ..core.formats import escaped
from ..core.workload import NativeCounters, RunTrace

#: Longest SSE line accepted: a server streaming bytes without a newline is an error, not a
#: buffer that grows until the deadline.
MAX_LINE_BYTES = 1 << 20
#: Bytes of an HTTP error body kept for the message.
MAX_ERROR_BODY_BYTES = 4096


class EarlyEndError(EngineError):
    """The server generated fewer tokens than asked (EOS or a stop it did not let us disable)."""


def short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return escaped(text if len(text) <= n else text[: n - 3] + "...")


def status_error(url: str, status: int, body: bytes, location: str | None) -> EngineError:
    """The one line for an HTTP status >= 300: a redirect (never followed: a redirected POST
    may lose its body, and the API key must not follow it elsewhere) or the server's error."""
    if status < 400:
        where = f"Location: {short(location)}" if location else "no Location given"
        return EngineError(
            f"HTTP {status} from {url}: redirects are not followed; use the final URL as the endpoint ({where})"
        )
    return EngineError(f"HTTP {status} from {url}: {short(body.decode('utf-8', 'replace')) or '(empty body)'}")


def is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_ms(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9


class StreamState:
    """What one request's stream said so far; ``feed`` each event's data with its arrival time."""

    def __init__(self, url: str, api: str, max_tokens: int, *, keep_text: bool = False) -> None:
        self.url, self.api, self.max_tokens = url, api, max_tokens
        self.stamps: list[int] = []
        #: The reply's text pieces, kept when asked (a conversation's reply, fed back to its next turn).
        self.text: list[str] | None = [] if keep_text else None
        self.usage: dict[str, JSONValue] | None = None
        self.timings: dict[str, JSONValue] | None = None
        self.finish: str | None = None
        self.done = False
        self.model: str | None = None

    def feed(self, data: str | None, now: int) -> bool:
        """Take one event (None: a comment); True once the stream said it is done."""
        if data is None:  # a comment (keep-alive ping)
            return False
        if data == "[DONE]":
            self.done = True
            return True
        event = parse_event(data, self.url)
        event_usage = event.get("usage")
        if event_usage is not None and not isinstance(event_usage, dict):
            raise EngineError(
                f'malformed event from {self.url}: "usage" is {short(json.dumps(event_usage), 40)}, not a JSON object'
            )
        if event_usage:
            self._check_usage(event_usage)
            self.usage = event_usage
        self._check_model(event.get("model"))
        timings = event.get("timings")
        if isinstance(timings, dict) and timings:
            self.timings = timings
        tokens, reason = tokens_in(event, self.api)
        if tokens:
            self.stamps.append(now)
            if self.text is not None:
                text = event_text(event, self.api)
                self.text.append(text if isinstance(text, str) else "")
        self.finish = reason if isinstance(reason, str) and reason else self.finish
        return False

    def _conflict(self, what: str) -> EngineError:
        return EngineError(f"conflicting values from {self.url} in one stream: {what}; the run is not comparable")

    def _check_model(self, model: object) -> None:
        """Every event of a stream names one model (the first one named is kept)."""
        if not isinstance(model, str) or not model:
            return
        if self.model is not None and model != self.model:
            raise self._conflict(f"model {short(self.model, 40)!r}, then {short(model, 40)!r}")
        self.model = model

    def _check_usage(self, usage: dict[str, JSONValue]) -> None:
        """A later usage (a server may send one per event) keeps the prompt's count and never
        counts fewer generated tokens than an earlier one."""
        if self.usage is None:
            return
        before, now = self.usage.get("prompt_tokens"), usage.get("prompt_tokens")
        if is_count(before) and is_count(now) and before != now:
            raise self._conflict(f"usage.prompt_tokens {before}, then {now}")
        counted, later = self.usage.get("completion_tokens"), usage.get("completion_tokens")
        if is_count(counted) and is_count(later) and later < counted:
            raise self._conflict(f"usage.completion_tokens {counted}, then {later}")

    def native(self) -> NativeCounters | None:
        """llama-server's per-request timings, when it sent plausible ones."""
        t = self.timings
        if not t:
            return None
        prompt_n, prompt_ms = t.get("prompt_n"), t.get("prompt_ms")
        predicted_n, predicted_ms = t.get("predicted_n"), t.get("predicted_ms")
        if not (is_count(prompt_n) and is_count(predicted_n) and _is_ms(prompt_ms) and _is_ms(predicted_ms)):
            return None
        return NativeCounters(
            prefill_ms=float(prompt_ms),
            prefill_tokens=prompt_n,
            decode_ms=float(predicted_ms),
            decode_tokens=predicted_n,
            source="llama-server timings",
        )

    def trace(self, start_ns: int) -> tuple[RunTrace, str]:
        """The run, and where its token count came from ("usage", "timings", ...)."""
        if not self.done and self.finish is None:
            raise EngineError(
                f"stream from {self.url} ended without [DONE] after {len(self.stamps)} tokens (truncated)"
            )
        native = self.native()
        counted, source = self._counted(native)
        self._check_complete(counted, source)
        prompt_tokens = self.usage.get("prompt_tokens") if self.usage else None
        trace = RunTrace(
            start_ns=start_ns,
            prefill_done_ns=None,
            token_ns=tuple(fit_stamps(self.stamps, counted)),
            prompt_tokens=prompt_tokens if is_count(prompt_tokens) else None,
            native=native,
        )
        return trace, source

    def _counted(self, native: NativeCounters | None) -> tuple[int, str]:
        """The run's token count and where it came from, in order of trust: the server's usage,
        llama-server's timings, ``max_tokens`` when it stopped at the length limit, the events."""
        n = self.max_tokens
        counted, source = len(self.stamps), "events"
        reported = self.usage.get("completion_tokens") if self.usage else None
        if isinstance(reported, int) and not isinstance(reported, bool):
            if not 0 <= reported <= n:
                raise EngineError(
                    f"implausible usage from {self.url}: completion_tokens {reported} for max_tokens {n}; "
                    "the run is not comparable"
                )
            if native is not None and native.decode_tokens != reported:
                raise self._conflict(
                    f"usage.completion_tokens {reported} but timings.predicted_n {native.decode_tokens}"
                )
            counted, source = reported, "usage"
        elif native is not None and native.decode_tokens <= n:
            counted, source = native.decode_tokens, "timings"
        elif self.finish == "length" and counted != n:
            # Events are not tokens one to one (llama-cpp-python sends empty events and flushes
            # held-back text late), but the server says it stopped at the limit we asked for.
            counted, source = n, "finish_reason"
        return counted, source

    def _check_complete(self, counted: int, source: str) -> None:
        """Refuse a run that is not comparable: no token, every token in one event (no gaps to
        measure), or fewer tokens than asked for."""
        n = self.max_tokens
        stamps = self.stamps
        if not stamps and not counted:
            end = "[DONE]" if self.done else f"finish_reason {short(repr(self.finish), 40)}"
            raise EarlyEndError(
                f"server at {self.url} sent no token: the stream ended with {end} before any (counted from "
                f"{source}); the server generated nothing for this request: see its log"
            )
        if counted >= n and len(stamps) < 2:
            raise EngineError(
                f"server sent all {n} tokens in {len(stamps)} event(s) (counted from {source}): no token gaps "
                "to measure; servers hold back text that is not yet whole UTF-8 (llama-server does), so a "
                "model emitting byte tokens can arrive at once; raise max_tokens or use a model with text tokens"
            )
        if counted < n or len(stamps) < 2:
            raise EarlyEndError(
                f"server generated {counted} of {n} tokens (finish_reason {short(repr(self.finish), 40)}, "
                f"counted from {source}); it does not honour ignore_eos/min_tokens: the run is not comparable"
            )


_EOL = re.compile(rb"\r\n|\r|\n")


class EventReader:
    """Bytes in, the ``data`` of each server-sent event out (multi-line data joined; None for a
    comment), one chunk at a time: a client reads its clock when a chunk arrives and only then
    parses it, so parsing is never part of an arrival time (both clients). Lines end with CRLF,
    LF or CR, as SSE allows; a line over ``MAX_LINE_BYTES`` is an error."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pending = b""
        self.buffer: list[str] = []

    def feed(self, chunk: bytes) -> list[str | None]:
        pending = self.pending + chunk
        held = pending.endswith(b"\r")  # maybe the first half of a CRLF split across chunks
        parts = _EOL.split(pending[:-1] if held else pending)
        self.pending = parts.pop() + (b"\r" if held else b"")
        if len(self.pending) > MAX_LINE_BYTES:
            raise EngineError(
                f"malformed stream from {self.url}: a line longer than {MAX_LINE_BYTES} bytes without a line end"
            )
        return [data for part in parts for data in self._line(part.decode("utf-8", "replace"))]

    def end(self) -> list[str | None]:
        rest = self.pending.rstrip(b"\r")
        self.pending = b""
        return (self._line(rest.decode("utf-8", "replace")) if rest else []) + self._line("")

    def _line(self, line: str) -> list[str | None]:
        """One line's events: an empty line ends the event under way."""
        if not line:
            if self.buffer:
                data, self.buffer = "\n".join(self.buffer), []
                return [data]
            return []
        if line.startswith(":"):
            return [None]
        field, _, value = line.partition(":")
        if field == "data":
            self.buffer.append(value.removeprefix(" "))
        return []


def parse_event(data: str, url: str) -> dict[str, JSONValue]:
    try:
        event = loads(data)
    except json.JSONDecodeError:
        raise EngineError(f"malformed event from {url}: {short(data, 80)!r} is not JSON") from None
    except DuplicateKey as exc:
        raise EngineError(f"malformed event from {url}: {exc}; the run is not comparable") from None
    if not isinstance(event, dict):
        raise EngineError(f"malformed event from {url}: {short(data, 80)!r} is not a JSON object")
    if "error" in event:
        err = event["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        raise EngineError(f"server error in stream from {url}: {short(str(message))}")
    return event


def event_text(event: dict[str, Any], api: str) -> object:
    """The text field of an event's first choice (``text``, or ``delta.content`` for chat) as
    sent, or None."""
    choices = event.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if api == "completions":
        return choice.get("text")
    delta = choice.get("delta") or {}
    return delta.get("content") if isinstance(delta, dict) else None


def tokens_in(event: dict[str, Any], api: str) -> tuple[bool, str | None]:
    """Whether this event carries a generated token, and its finish_reason.

    A token event has the text field (``text``, or ``delta.content`` for chat) and either
    some text or no finish_reason yet: a token can decode to no text (a partial UTF-8 byte),
    while a closing event carries only the finish_reason.
    """
    choices = event.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return False, None
    reason = choices[0].get("finish_reason")
    text = event_text(event, api)
    if text is None:
        return False, reason
    return bool(text) or reason is None, reason


def fit_stamps(stamps: list[int], n_tokens: int) -> list[int]:
    """One arrival time per generated token when events and tokens do not pair up.

    More events than tokens: the first ``n - 1`` and the last (the stream's end stays the
    end). Fewer: tokens that came merged into one event arrived with it; the missing ones are
    put on the last event (where servers flush held-back text), so TPOT divides by the true
    count and those tokens show an ITL of 0.
    """
    if len(stamps) > n_tokens:
        return stamps[: n_tokens - 1] + stamps[-1:]
    return stamps + stamps[-1:] * (n_tokens - len(stamps))
