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
(a stalled stream), ``request_timeout_s`` for the whole request. No run can hang.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Iterator

from ..engine_info import EngineInfo
from ..errors import ConfigError, EngineError
from ..trace import RunTrace
from ..workload import Workload
from .callable import synthetic_text

APIS = ("completions", "chat")
DEFAULT_API_KEY_ENV = "LLMPERF_API_KEY"


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
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(token_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
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
        import httpx

        body = self.body(workload, run_index)
        clock = time.perf_counter_ns
        stamps: list[int] = []
        usage: dict[str, Any] | None = None
        finish: str | None = None
        done = False
        deadline = time.monotonic() + self.request_timeout_s
        start = clock()
        try:
            with self._client.stream("POST", self.url, json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise EngineError(
                        f"HTTP {response.status_code} from {self.url}: {_short(response.text) or '(empty body)'}"
                    )
                for data in _sse_data(response.iter_lines()):
                    now = clock()
                    if time.monotonic() > deadline:
                        raise EngineError(
                            f"request to {self.url} took longer than {self.request_timeout_s:g} s "
                            f"({len(stamps)} tokens so far); raise the request timeout or shorten the workload"
                        )
                    if data is None:  # a comment (keep-alive ping): only the deadline counts
                        continue
                    if data == "[DONE]":
                        done = True
                        break
                    event = _parse(data, self.url)
                    if event.get("usage"):
                        usage = event["usage"]
                    tokens, reason = _tokens_in(event, self.api)
                    if tokens:
                        stamps.append(now)
                    finish = reason or finish
        except httpx.ConnectError as exc:
            raise EngineError(f"cannot connect to {self.url} ({exc}); is the server running?") from None
        except httpx.ConnectTimeout:
            raise EngineError(f"cannot connect to {self.url} within the connect timeout; is the server up?") from None
        except httpx.TimeoutException:
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
        if usage and isinstance(usage.get("completion_tokens"), int):
            counted, source = usage["completion_tokens"], "usage"
        elif finish == "length" and counted != n:
            # Events are not tokens one to one (llama-cpp-python sends empty events and flushes
            # held-back text late), but the server says it stopped at the limit we asked for.
            counted, source = n, "finish_reason"
        with self._lock:
            self._token_count.add(source)
        if counted < n or len(stamps) < 2:
            raise EarlyEndError(
                f"server generated {counted} of {n} tokens (finish_reason {finish!r}, counted from {source}); "
                "it does not honour ignore_eos/min_tokens: the run is not comparable"
            )
        stamps = fit_stamps(stamps, counted)
        prompt_tokens = usage.get("prompt_tokens") if usage else None
        return RunTrace(
            start_ns=start,
            prefill_done_ns=None,
            token_ns=tuple(stamps),
            prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
        )

    def close(self) -> None:
        self._client.close()


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
