"""An OpenAI-compatible server, measured through its streaming API (server-sent events).

Works with llama.cpp's and llama-cpp-python's servers, vLLM, TGI: ``POST /v1/completions`` or
``/v1/chat/completions`` with ``stream=true``. Each event that carries a generated token is
stamped when its line arrives, so TTFT and the token gaps include the network and the
server's own queueing, as a client sees them.

Token counts come from the server's ``usage`` (asked for with ``stream_options``) when it
sends one; else, when it stopped with ``finish_reason="length"``, they are the ``max_tokens``
asked for (events and tokens need not pair up: llama-cpp-python sends empty events and
flushes held-back text late); else from the events. ``info().token_count`` says which, and
``fit_stamps`` gives each token an arrival time. The request asks for
exactly ``max_tokens`` (``min_tokens`` and ``ignore_eos``, which servers that do not know them
ignore); a run that still ends early is an error naming the count, never averaged in.

Timeouts: ``connect_timeout_s`` to connect, ``token_timeout_s`` for any gap between bytes
(a stalled stream), ``request_timeout_s`` for the whole request. httpx's timeouts are per
socket operation, so a server that trickles a byte at a time would never hit them: every
socket operation of a request is given at most the time left to its deadline (a wrapped
network backend), so no run can hang, whatever the server sends.

What a server sends is untrusted: events are size-capped and checked, and any text of the
server's that ends up in a message has the configured API key redacted.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Any, Iterable, Iterator

from ..engine_info import EngineInfo
from ..errors import ConfigError, EngineError
from ..trace import RunTrace
from ..workload import Workload
from .callable import synthetic_text

APIS = ("completions", "chat")
DEFAULT_API_KEY_ENV = "LLMPERF_API_KEY"
#: Longest SSE line accepted: a server streaming bytes without a newline is an error, not a
#: buffer that grows until the deadline.
MAX_LINE_BYTES = 1 << 20
#: Bytes of an HTTP error body kept for the message.
MAX_ERROR_BODY_BYTES = 4096
REDACTED = "***"


class EarlyEndError(EngineError):
    """The server generated fewer tokens than asked (EOS or a stop it did not let us disable)."""


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


class HttpEngine:
    """One OpenAI-compatible endpoint; safe to call from several threads (load tests).

    ``endpoint``: the API base, e.g. ``http://127.0.0.1:8000/v1`` (``/v1`` is added when the
    URL has no path). The API key is read from the environment variable ``api_key_env`` and
    only ever sent in the Authorization header: it is in no report, record or repr.
    """

    concurrent_safe = True

    def __init__(
        self,
        endpoint: str,
        *,
        model: str | None = None,
        api: str = "completions",
        api_key_env: str = DEFAULT_API_KEY_ENV,
        connect_timeout_s: float = 5.0,
        token_timeout_s: float = 30.0,
        request_timeout_s: float = 300.0,
        ignore_eos: bool = True,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        import httpx

        if api not in APIS:
            raise ConfigError(f"unknown API {api!r}; use one of: {', '.join(APIS)}")
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"endpoint must be an http(s) URL like http://127.0.0.1:8000/v1, got {endpoint!r}")
        base = endpoint.rstrip("/")
        if httpx.URL(base).path in ("", "/"):
            base += "/v1"
        self.endpoint = base
        self.api = api
        self.url = f"{base}/completions" if api == "completions" else f"{base}/chat/completions"
        self.model = model
        self.ignore_eos = ignore_eos
        self.extra_body = dict(extra_body or {})
        self.request_timeout_s = request_timeout_s
        self.token_timeout_s = token_timeout_s
        headers = {"Accept": "text/event-stream"}
        key = os.environ.get(api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        # Server text is redacted of the key (and its JSON-escaped form) before it is shown.
        self._secrets = tuple(sorted({key, json.dumps(key)[1:-1]}, key=len, reverse=True)) if key else ()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(token_timeout_s, connect=connect_timeout_s),
            transport=_deadline_transport(httpx.HTTPTransport(limits=limits)),
        )
        self._lock = threading.Lock()
        self._token_count: set[str] = set()

    def __repr__(self) -> str:
        return f"HttpEngine({self.url!r}, model={self.model!r})"

    # -- Engine protocol -----------------------------------------------------------------------

    def info(self) -> EngineInfo:
        return EngineInfo(
            engine=f"http {self.api}",
            model=self.model or "(server default)",
            endpoint=self.endpoint,
            token_count="+".join(sorted(self._token_count)) or None,
        )

    def body(self, workload: Workload, run_index: int) -> dict[str, Any]:
        """The request. A synthetic prompt differs per run (seeded by the workload's seed and
        the run index) so the server cannot reuse a cached prefix across runs."""
        prompt = workload.prompt
        if prompt is None:
            words = workload.synthetic_prompt_tokens or 0
            prompt = synthetic_text(words, seed=(workload.seed * 1_000_003 + run_index + 1) % 2**63)
        n = workload.max_tokens
        body: dict[str, Any] = {
            "max_tokens": n,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.model:
            body["model"] = self.model
        if self.api == "completions":
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = n
        body.update(self.extra_body)
        return body

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        _DEADLINE.at, _DEADLINE.hit = time.monotonic() + self.request_timeout_s, False
        try:
            return self._run(workload, run_index)
        except EngineError as exc:
            message = self.redact(str(exc))
            if message != str(exc):
                raise type(exc)(message) from None
            raise
        finally:
            _DEADLINE.at = None

    def redact(self, text: str) -> str:
        """``text`` with the configured API key replaced by ``***``."""
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    def _too_long(self, n_tokens: int) -> EngineError:
        return EngineError(
            f"request to {self.url} took longer than {self.request_timeout_s:g} s "
            f"({n_tokens} tokens so far); raise the request timeout or shorten the workload"
        )

    def _run(self, workload: Workload, run_index: int) -> RunTrace:
        import httpx

        body = self.body(workload, run_index)
        clock = time.perf_counter_ns
        stamps: list[int] = []
        usage: dict[str, Any] | None = None
        finish: str | None = None
        done = False
        deadline = _DEADLINE.at
        start = clock()
        try:
            with self._client.stream("POST", self.url, json=body) as response:
                if response.status_code >= 400:
                    text = _head(response.iter_bytes(), MAX_ERROR_BODY_BYTES).decode("utf-8", "replace")
                    raise EngineError(f"HTTP {response.status_code} from {self.url}: {_short(text) or '(empty body)'}")
                for data in _sse_data(_lines(response.iter_bytes(), self.url)):
                    now = clock()
                    if time.monotonic() > deadline:
                        raise self._too_long(len(stamps))
                    if data is None:  # a comment (keep-alive ping): only the deadline counts
                        continue
                    if data == "[DONE]":
                        done = True
                        break
                    event = _parse(data, self.url)
                    event_usage = event.get("usage")
                    if event_usage is not None and not isinstance(event_usage, dict):
                        raise EngineError(
                            f"malformed event from {self.url}: \"usage\" is {_short(json.dumps(event_usage), 40)}, "
                            "not a JSON object"
                        )
                    if event_usage:
                        usage = event_usage
                    tokens, reason = _tokens_in(event, self.api)
                    if tokens:
                        stamps.append(now)
                    finish = reason if isinstance(reason, str) and reason else finish
        except httpx.ConnectError as exc:
            raise EngineError(f"cannot connect to {self.url} ({exc}); is the server running?") from None
        except httpx.TimeoutException as exc:
            if _DEADLINE.hit:
                raise self._too_long(len(stamps)) from None
            if isinstance(exc, httpx.ConnectTimeout):
                raise EngineError(f"cannot connect to {self.url} within the connect timeout; is the server up?") from None
            what = "the first token" if not stamps else f"the token after {len(stamps)}"
            raise EngineError(
                f"server stalled: no data from {self.url} within {self.token_timeout_s:g} s "
                f"(waiting for {what}); raise the token timeout or check the server"
            ) from None
        except httpx.HTTPError as exc:
            raise EngineError(
                f"connection to {self.url} broke after {len(stamps)} tokens: {type(exc).__name__}: {exc}"
            ) from None
        if not done and finish is None:
            raise EngineError(f"stream from {self.url} ended without [DONE] after {len(stamps)} tokens (truncated)")
        n = workload.max_tokens
        counted, source = len(stamps), "events"
        reported = usage.get("completion_tokens") if usage else None
        if isinstance(reported, int) and not isinstance(reported, bool):
            if not 0 <= reported <= n:
                raise EngineError(
                    f"implausible usage from {self.url}: completion_tokens {reported} for max_tokens {n}; "
                    "the run is not comparable"
                )
            counted, source = reported, "usage"
        elif finish == "length" and counted != n:
            # Events are not tokens one to one (llama-cpp-python sends empty events and flushes
            # held-back text late), but the server says it stopped at the limit we asked for.
            counted, source = n, "finish_reason"
        with self._lock:
            self._token_count.add(source)
        if counted < n or len(stamps) < 2:
            raise EarlyEndError(
                f"server generated {counted} of {n} tokens (finish_reason {_short(repr(finish), 40)}, "
                f"counted from {source}); it does not honour ignore_eos/min_tokens: the run is not comparable"
            )
        stamps = fit_stamps(stamps, counted)
        prompt_tokens = usage.get("prompt_tokens") if usage else None
        return RunTrace(
            start_ns=start,
            prefill_done_ns=None,
            token_ns=tuple(stamps),
            prompt_tokens=prompt_tokens if _count(prompt_tokens) else None,
        )

    def close(self) -> None:
        self._client.close()


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _head(chunks: Iterable[bytes], limit: int) -> bytes:
    """The first ``limit`` bytes of a body (an error page can be of any size)."""
    data = b""
    for chunk in chunks:
        data += chunk
        if len(data) >= limit:
            break
    return data[:limit]


_EOL = re.compile(rb"\r\n|\r|\n")


def _lines(chunks: Iterable[bytes], url: str) -> Iterator[str]:
    """The lines of a byte stream (ended by CRLF, LF or CR, as SSE allows), decoded as UTF-8;
    each line is yielded as soon as its end arrives. A line over ``MAX_LINE_BYTES`` is an error."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        held = pending.endswith(b"\r")  # maybe the first half of a CRLF split across chunks
        parts = _EOL.split(pending[:-1] if held else pending)
        pending = parts.pop() + (b"\r" if held else b"")
        for part in parts:
            yield part.decode("utf-8", "replace")
        if len(pending) > MAX_LINE_BYTES:
            raise EngineError(
                f"malformed stream from {url}: a line longer than {MAX_LINE_BYTES} bytes without a line end"
            )
    if pending.rstrip(b"\r"):
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


class _Deadline(threading.local):
    """The running request's deadline (``time.monotonic()``), per thread: a sync httpx request
    does all its socket work in the thread that made it. ``hit``: the last socket operation
    was cut short by the deadline, not by its own timeout."""

    at: float | None = None
    hit: bool = False


_DEADLINE = _Deadline()


def _clamp(timeout: float | None) -> float | None:
    at = _DEADLINE.at
    if at is None:
        return timeout
    left = max(at - time.monotonic(), 0.001)
    _DEADLINE.hit = timeout is None or left < timeout
    return left if _DEADLINE.hit else timeout


class _DeadlineStream:
    """A network stream whose every read and write waits at most until the request's deadline."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _clamp(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _clamp(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, _clamp(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend:
    """httpcore's network backend, with streams and connects bounded by the deadline."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, *args: Any, **kwargs: Any) -> Any:
        return _DeadlineStream(self._backend.connect_tcp(host, port, _clamp(timeout), *args, **kwargs))

    def connect_unix_socket(self, path: str, timeout: float | None = None, *args: Any, **kwargs: Any) -> Any:
        return _DeadlineStream(self._backend.connect_unix_socket(path, _clamp(timeout), *args, **kwargs))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _deadline_transport(transport: Any) -> Any:
    """``transport`` with its connection pool's network backend wrapped in ``_DeadlineBackend``.

    httpx has no public hook for this; its pool keeps the backend in ``_network_backend``
    (httpcore >= 0.17). tests/test_hostile.py fails if a trickling server outlives the deadline."""
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is None:
        raise EngineError("this httpx/httpcore version is not supported (no network backend to bound); pin httpx<1")
    pool._network_backend = _DeadlineBackend(backend)
    return transport


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


def _sse_data(lines: Iterator[str]) -> Iterator[str | None]:
    """The ``data`` of each server-sent event (multi-line data joined); None for a comment."""
    buffer: list[str] = []
    for line in lines:
        if not line:
            if buffer:
                yield "\n".join(buffer)
                buffer = []
            continue
        if line.startswith(":"):
            yield None
            continue
        field, _, value = line.partition(":")
        if field == "data":
            buffer.append(value[1:] if value.startswith(" ") else value)
    if buffer:
        yield "\n".join(buffer)


def _parse(data: str, url: str) -> dict[str, Any]:
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        raise EngineError(f"malformed event from {url}: {_short(data, 80)!r} is not JSON") from None
    if not isinstance(event, dict):
        raise EngineError(f"malformed event from {url}: {_short(data, 80)!r} is not a JSON object")
    if "error" in event:
        err = event["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        raise EngineError(f"server error in stream from {url}: {_short(str(message))}")
    return event


def _tokens_in(event: dict[str, Any], api: str) -> tuple[bool, str | None]:
    """Whether this event carries a generated token, and its finish_reason.

    A token event has the text field (``text``, or ``delta.content`` for chat) and either
    some text or no finish_reason yet: a token can decode to no text (a partial UTF-8 byte),
    while a closing event carries only the finish_reason.
    """
    choices = event.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return False, None
    choice = choices[0]
    reason = choice.get("finish_reason")
    if api == "completions":
        text = choice.get("text")
    else:
        delta = choice.get("delta") or {}
        text = delta.get("content") if isinstance(delta, dict) else None
    if text is None:
        return False, reason
    return bool(text) or reason is None, reason
