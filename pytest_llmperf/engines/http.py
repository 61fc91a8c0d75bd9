"""An OpenAI-compatible server, measured through its streaming API (server-sent events).

Works with llama.cpp's llama-server and llama-cpp-python's server, vLLM, TGI: ``POST
/v1/completions`` or ``/v1/chat/completions`` with ``stream=true``. Each event that carries a
generated token is stamped when its line arrives, so TTFT and the token gaps include the
network and the server's own queueing, as a client sees them. Parsing, token counts and
llama-server's per-request ``timings`` are in engines/sse.py.

No prompt-cache illusions: every synthetic prompt is unique (seeded by a per-engine salt and
the request index) unless the workload asks for a shared prefix (``shared_prefix_tokens``),
and the request carries ``cache_prompt`` (llama-server: reuse a slot's cached prefix or not;
other servers ignore it) set to whether a shared prefix was asked for.

Two clients: ``run`` (one request, synchronous; single-stream measurements) and ``arun`` (on an
``httpx.AsyncClient``; load tests run every in-flight request on one event loop, so 64 streams
cost no thread switches between the arrival of a line and its timestamp).

Timeouts: ``connect_timeout_s`` to connect, ``token_timeout_s`` for any gap between bytes
(a stalled stream), ``request_timeout_s`` for the whole request. httpx's timeouts are per
socket operation, so a server that trickles a byte at a time would never hit them: in the
synchronous client every socket operation is given at most the time left to its deadline (a
wrapped network backend); the asynchronous one cancels the request at its deadline.

What a server sends is untrusted: events are size-capped and checked, and any text of the
server's or httpx's that ends up in a message is cleaned of the API key and the URL's secrets
(``core.redact``); ``url``/``endpoint`` are as shown (``user:***@``, ``api_key=***``).

llama-server's Prometheus ``/metrics`` (started with ``--metrics``), read and parsed.

Only llama.cpp's own series (``llamacpp:*``) are kept, without labels: counters such as
``prompt_tokens_total`` and ``n_decode_total`` are compared before and after a load level, so
the server's count of what it did sits beside the client's (docs/served.md). Reading is
best-effort with a short deadline, and done outside every timed region."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import secrets
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..core.documents import DuplicateKey, loads
from ..core.errors import ConfigError, EngineError
from ..core.redact import Redactor, Url, redact
from ..core.settings import APIS, SETTINGS, endpoint_url
from ..core.workload import EngineInfo, RunTrace, SentRequest, SetRequest, TokenLogits, Workload, chat_dicts
from . import NOT_ONE_REQUEST, synthetic_text, turn_chat
from .capabilities import AsyncRuns, Closable, ConcurrentRuns, Engine, NeedsPromptIds, SentRequests, ServerMetrics
from .sse import MAX_ERROR_BODY_BYTES, EventReader, StreamState, status_error

if TYPE_CHECKING:
    import argparse
    import ssl

    import httpcore
    import httpx
    import numpy as np
    import numpy.typing as npt

    from ..core.settings import EngineSettings

DEFAULT_API_KEY_ENV: str = SETTINGS["api_key_env"].default
#: Top log-probabilities asked per position for output agreement (OpenAI's top_logprobs cap).
TOP_K = 20


def _api_key(api_key_env: str) -> str | None:
    """The API key in ``$api_key_env`` (None or empty: none), refused when an HTTP header
    cannot carry it: httpx would raise with the key in the traceback's locals."""
    key = os.environ.get(api_key_env)
    if key:
        bad = next((i for i, c in enumerate(key) if not (c.isascii() and c.isprintable())), None)
        if bad is not None:
            raise ConfigError(
                f"${api_key_env} holds a character at position {bad + 1} that an HTTP header cannot "
                "carry (ASCII letters, digits and punctuation only); set it to the key exactly as issued"
            )
    return key


class HttpEngine(Engine, ConcurrentRuns, AsyncRuns, ServerMetrics, NeedsPromptIds, SentRequests, Closable):
    """One OpenAI-compatible endpoint; ``run`` is safe to call from several threads, ``arun``
    from many tasks of one event loop (load tests).

    ``endpoint``: the API base, e.g. ``http://127.0.0.1:8000/v1`` (``/v1`` is added when the
    URL has no path). The API key is read from the environment variable ``api_key_env`` and
    only ever sent in the Authorization header: it is in no report, record or repr.
    """

    concurrent_safe: Literal[True] = True
    #: Keep every request sent for ``take_sent`` (the session sets it under ``--llmperf-write-trace``).
    keep_sent: bool = False

    def __init__(
        self,
        endpoint: str,
        *,
        model: str | None = None,
        api: str = APIS[0],
        api_key_env: str = DEFAULT_API_KEY_ENV,
        connect_timeout_s: float = 5.0,
        token_timeout_s: float = SETTINGS["token_timeout"].default,
        request_timeout_s: float = SETTINGS["request_timeout"].default,
        ignore_eos: bool = True,
        extra_body: dict[str, object] | None = None,
        prompt_salt: int | None = None,
        keep_sent: bool = False,
    ) -> None:
        import httpx

        self._routes(endpoint, api)
        self.api = api
        self.model = model
        self.ignore_eos = ignore_eos
        self.extra_body = dict(extra_body or {})
        self.request_timeout_s = request_timeout_s
        self.token_timeout_s = token_timeout_s
        self.connect_timeout_s = connect_timeout_s
        #: Mixed into every synthetic prompt's seed: a server that outlives this engine (a
        #: shared deployment, an earlier session) has none of its prompts cached.
        self.prompt_salt = secrets.randbits(48) if prompt_salt is None else prompt_salt
        headers = {"Accept": "text/event-stream"}
        key = _api_key(api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._redactor = Redactor.of([endpoint], [key])
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._headers = headers
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(token_timeout_s, connect=connect_timeout_s),
            transport=_deadline_transport(httpx.HTTPTransport(limits=limits)),
        )
        self._lock = threading.Lock()
        self._token_count: set[str] = set()
        self._talk: tuple[int, list[str]] = (0, [])  # a conversation's run: its replies so far
        self._metrics_missing = False
        #: While ``keep_sent``: every request sent (``take_sent``), when the client began it and what it asked.
        self.keep_sent = keep_sent
        self._sent: list[SentRequest] = []

    def _routes(self, endpoint: str, api: str) -> None:
        """The URLs this engine sends to (``_urls``, llama-server's own ``/completion``
        and ``/metrics``) and shows (``url``, ``endpoint``: no credentials), from ``endpoint``."""
        import httpx

        if api not in APIS:
            raise ConfigError(f"unknown API {api!r}; use one of: {', '.join(APIS)}")
        try:
            endpoint_url(endpoint)  # the endpoint option's own check
        except ValueError as exc:
            raise ConfigError(f"endpoint {exc}") from None
        parts = Url.split(endpoint.strip())
        assert parts is not None  # an http(s):// URL, checked above
        path = parts.path.rstrip("/") or "/v1"  # the query (an API key in it) stays after the path
        routes = {"completions": path + "/completions", "chat": path + "/chat/completions"}
        #: Sent vs shown, by API: a chat request (``Workload.messages``) goes to chat/completions.
        self._urls = {name: (parts.at(route).sent(), parts.at(route).shown()) for name, route in routes.items()}
        self.url = self._urls[api][1]
        native = path.rsplit("/v1", 1)[0]  # llama-server's own routes, beside /v1
        # Token probabilities: token-id prompts, ids in the reply.
        self._native_completion_url = parts.at(native + "/completion").sent()
        self._metrics_url, self.endpoint = parts.at(native + "/metrics").sent(), parts.at(path).shown()
        try:
            httpx.URL(self._urls[api][0])
        except (httpx.InvalidURL, ValueError, TypeError) as exc:
            raise ConfigError(f"endpoint {self.endpoint!r} is not a valid URL ({redact(str(exc))}); fix it") from None

    @classmethod
    def from_settings(
        cls, endpoint: str, settings: EngineSettings | argparse.Namespace, model: str | None
    ) -> HttpEngine:
        """The engine the endpoint settings describe (``api``, ``api_key_env``,
        ``request_timeout``, ``token_timeout``: the settings table's names), read from the
        pytest session's settings or the ``llmperf load`` arguments alike."""
        return cls(
            endpoint,
            model=model,
            api=settings.api,
            api_key_env=settings.api_key_env,
            request_timeout_s=settings.request_timeout,
            token_timeout_s=settings.token_timeout,
        )

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

    def body(self, workload: Workload, run_index: int) -> dict[str, object]:
        """The request. A synthetic prompt differs per request (seeded by the engine's salt,
        the workload's seed and the request index) so no server can answer from a cached
        prefix; with ``shared_prefix_tokens`` its first words are the same in every request."""
        if workload.conversation is not None and workload.turn is None:
            raise EngineError(NOT_ONE_REQUEST)
        prompt = workload.prompt
        if prompt is None and workload.messages is None:
            words = workload.synthetic_prompt_tokens or 0
            base = (self.prompt_salt * 1_000_003 + workload.seed) % 2**62
            shared = workload.shared_prefix_tokens or 0
            prompt = synthetic_text(words - shared, seed=(base * 1_000_003 + run_index + 1) % 2**63)
            if shared:
                prompt = synthetic_text(shared, seed=base) + " " + prompt
        n = workload.max_tokens
        body: dict[str, object] = {
            "max_tokens": n,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
            # llama-server: reuse a slot's cached prompt prefix only when that is what is measured.
            "cache_prompt": bool(workload.shared_prefix_tokens),
        }
        if self.model:
            body["model"] = self.model
        if workload.turn is not None:  # a conversation's turn: its chat so far, the replies fed back
            body["messages"] = chat_dicts(turn_chat(self._talk, workload, run_index))
            body["cache_prompt"] = workload.turn > 1  # what the run's earlier turns left, reused
        elif workload.messages is not None:  # as they are: the server renders its model's template
            body["messages"] = chat_dicts(workload.messages)
        elif self.api == "completions":
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = n
        body.update(self.extra_body)
        return body

    def _note_sent(self, workload: Workload, body: dict[str, object]) -> None:
        """The request about to be sent, as a trace's line holds it (``take_sent``): its prompt
        as sent (a synthetic one's text too) or its messages, and max_tokens; never a header.
        Before the request's first clock read; nothing unless ``keep_sent``."""
        if not self.keep_sent:
            return
        messages = workload.messages
        prompt = body.get("prompt")
        if messages is None and prompt is None:  # the chat API: the prompt as the user's message
            chat = body["messages"]
            assert isinstance(chat, list)
            prompt = chat[0]["content"]
        request = SetRequest(prompt=None if messages is not None else str(prompt), messages=messages)
        sent = SentRequest(time.perf_counter_ns(), request._replace(max_tokens=workload.max_tokens))
        with self._lock:
            self._sent.append(sent)

    def take_sent(self) -> list[SentRequest]:
        """The requests sent since the last call, in the order they were begun."""
        with self._lock:
            sent, self._sent = self._sent, []
        return sorted(sent, key=lambda r: r.sent_ns)

    def _target(self, workload: Workload) -> tuple[str, str, str]:
        """Where a request goes: (API, URL sent, URL shown); chat messages to chat/completions."""
        api = "chat" if workload.messages is not None or workload.turn is not None else self.api
        return (api, *self._urls[api])

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        _DEADLINE.at, _DEADLINE.hit = time.monotonic() + self.request_timeout_s, False
        try:
            return self._run(workload.request(run_index), run_index)  # a prompt set's request of this run
        except EngineError as exc:
            message = self.redact(str(exc))
            if message != str(exc):
                raise type(exc)(message) from None
            raise
        finally:
            _DEADLINE.at = None

    def redact(self, text: str) -> str:
        """``text`` with the API key and the endpoint URL's secrets replaced by ``***``."""
        return self._redactor.text(text)

    def _too_long(self, n_tokens: int) -> EngineError:
        return EngineError(
            f"request to {self.url} took longer than {self.request_timeout_s:g} s "
            f"({n_tokens} tokens so far); raise the request timeout or shorten the workload"
        )

    def _finish(self, state: StreamState, start_ns: int) -> RunTrace:
        trace, source = state.trace(start_ns)
        with self._lock:
            self._token_count.add(source)
        return trace

    def _run(self, workload: Workload, run_index: int) -> RunTrace:
        import httpx

        body = self.body(workload, run_index)
        self._note_sent(workload, body)
        clock = time.perf_counter_ns
        api, url, shown = self._target(workload)
        state = StreamState(shown, api, workload.max_tokens, keep_text=workload.turn is not None)
        deadline = _DEADLINE.at
        assert deadline is not None  # run() sets it
        start = clock()
        try:
            with self._client.stream("POST", url, json=body) as response:
                if response.status_code >= 300:  # an error, or a redirect (not followed)
                    raise self._refused(response, shown)
                reader = EventReader(shown)
                for chunk in response.iter_bytes():
                    now = clock()  # first: parsing below is not part of this chunk's arrival
                    if time.monotonic() > deadline:
                        raise self._too_long(len(state.stamps))
                    if any(state.feed(data, now) for data in reader.feed(chunk)):
                        break
                else:
                    for data in reader.end():
                        state.feed(data, clock())
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, state, _DEADLINE.hit) from None
        trace = self._finish(state, start)
        return trace if workload.turn is None else self._replied(workload.turn, run_index, state, trace)

    def _replied(self, turn: int, run_index: int, state: StreamState, trace: RunTrace) -> RunTrace:
        """A conversation turn's trace with the prompt tokens the server reused (its usage's
        prompt tokens less those its timings say it evaluated; None when it sent either not),
        its reply kept for the run's next turn."""
        reply = "".join(state.text or ())
        self._talk = (run_index, [*self._talk[1], reply] if turn > 1 else [reply])
        native, total = trace.native, trace.prompt_tokens
        if native is None or total is None:
            return trace
        return dataclasses.replace(trace, prompt_reused_tokens=max(total - native.prefill_tokens, 0))

    def _refused(self, response: httpx.Response, shown: str) -> EngineError:
        """The error for a response of status >= 300, with the head of its body."""
        head = b""  # an error page can be of any size: its first MAX_ERROR_BODY_BYTES
        for chunk in response.iter_bytes():
            head += chunk
            if len(head) >= MAX_ERROR_BODY_BYTES:
                break
        return status_error(shown, response.status_code, head[:MAX_ERROR_BODY_BYTES], response.headers.get("location"))

    # -- asynchronous client (load tests) --------------------------------------------------------

    def async_client(self) -> httpx.AsyncClient:
        """A new ``httpx.AsyncClient`` like the synchronous one; use it on one event loop."""
        import httpx

        return httpx.AsyncClient(
            headers=self._headers,
            timeout=httpx.Timeout(self.token_timeout_s, connect=self.connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )

    async def arun(self, workload: Workload, run_index: int, client: httpx.AsyncClient) -> RunTrace:
        """``run`` on ``client`` (from ``async_client``); cancelled at the request's deadline."""
        workload = workload.request(run_index)
        api, url, shown = self._target(workload)
        state = StreamState(shown, api, workload.max_tokens)
        try:
            return await asyncio.wait_for(self._arun(workload, run_index, client, url, state), self.request_timeout_s)
        except asyncio.TimeoutError:
            raise EngineError(self.redact(str(self._too_long(len(state.stamps))))) from None
        except EngineError as exc:
            message = self.redact(str(exc))
            if message != str(exc):
                raise type(exc)(message) from None
            raise

    async def _arun(
        self, workload: Workload, run_index: int, client: httpx.AsyncClient, url: str, state: StreamState
    ) -> RunTrace:
        """``arun``'s request to ``url`` (``_target``'s, computed there once), read into ``state``."""
        import httpx

        body = self.body(workload, run_index)
        self._note_sent(workload, body)
        clock = time.perf_counter_ns
        shown = state.url  # the URL shown (``_target``'s third)
        reader = EventReader(shown)
        start = clock()
        try:
            async with client.stream("POST", url, json=body) as response:
                if response.status_code >= 300:
                    raise await self._arefused(response, shown)
                async for chunk in response.aiter_bytes():
                    now = clock()  # first: parsing below is not part of this chunk's arrival
                    if any(state.feed(data, now) for data in reader.feed(chunk)):
                        return self._finish(state, start)
                for data in reader.end():
                    state.feed(data, clock())
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, state, False) from None
        return self._finish(state, start)

    async def _arefused(self, response: httpx.Response, shown: str) -> EngineError:
        """``_refused`` for an asynchronous response."""
        head = b""
        async for chunk in response.aiter_bytes():
            head += chunk
            if len(head) >= MAX_ERROR_BODY_BYTES:
                break
        return status_error(shown, response.status_code, head[:MAX_ERROR_BODY_BYTES], response.headers.get("location"))

    # -- errors ----------------------------------------------------------------------------------

    def _transport_error(self, exc: Exception, state: StreamState, deadline_hit: bool) -> EngineError:
        import httpx

        n = len(state.stamps)
        if isinstance(exc, httpx.ConnectError) and "[SSL" in str(exc) and "CERTIFICATE" not in str(exc):
            return EngineError(
                f"TLS handshake with {self.url} failed ({exc}); is the server plain http? "
                "then give the endpoint as http://"
            )
        if isinstance(exc, httpx.ConnectError):
            return EngineError(f"cannot connect to {self.url} ({exc}); is the server running?")
        if isinstance(exc, httpx.TimeoutException):
            if deadline_hit:
                return self._too_long(n)
            if isinstance(exc, httpx.ConnectTimeout):
                return EngineError(f"cannot connect to {self.url} within the connect timeout; is the server up?")
            what = "the first token" if not n else f"the token after {n}"
            return EngineError(
                f"server stalled: no data from {self.url} within {self.token_timeout_s:g} s "
                f"(waiting for {what}); raise the token timeout or check the server"
            )
        return EngineError(f"connection to {self.url} broke after {n} tokens: {type(exc).__name__}: {exc}")

    def server_metrics(self) -> dict[str, float] | None:
        """llama-server's ``/metrics`` (``llamacpp:*`` series), or None where there are none.
        The first miss is remembered: other servers are not asked again."""
        if self._metrics_missing:
            return None

        _DEADLINE.at, _DEADLINE.hit = time.monotonic() + 5.0, False
        try:
            values = read(self._client, self._metrics_url)
        finally:
            _DEADLINE.at = None
        self._metrics_missing = values is None
        return values

    # -- token probabilities (output agreement, measuring.agreement): after the timed runs -------

    #: The top-k next-token log-probabilities (:meth:`token_logits`), where the server sends
    #: token ids with them (llama-server's ``/completion`` with ``n_probs``); the prompt's token
    #: ids come from the other side (``NeedsPromptIds``).
    needs_prompt_ids: Literal[True] = True

    def token_logits(
        self, workload: Workload, forced: Sequence[int] | None = None, prompt_ids: Sequence[int] | None = None
    ) -> TokenLogits | str:
        """Greedy (temperature 0, end of generation banned) from ``prompt_ids``: the server's
        continuation of ``max_tokens`` ids and its top-``TOP_K`` log-probabilities at each
        position of ``forced`` (None: its own tokens). A position stays teacher-forced while the
        server's tokens follow ``forced``; where one parts, the next request starts from the
        forced prefix up to there (one request per divergence). A string: why the server
        cannot say (it takes no token-id prompt, or sends no token ids)."""
        if prompt_ids is None:
            return "an endpoint needs the prompt's token ids from the other side"
        n = workload.max_tokens
        got = self._top_logprobs(prompt_ids, n)
        if isinstance(got, str):
            return got
        greedy = [token for token, _ in got]
        if len(greedy) < n:
            return f"the endpoint generated {len(greedy)} of {n} tokens with ignore_eos"
        rows = self._forced_rows(prompt_ids, list(greedy if forced is None else forced), got, n)
        if isinstance(rows, str):
            return rows
        ids, logprobs = _top_arrays(rows, n)
        return TokenLogits(tuple(prompt_ids), tuple(greedy[:n]), None, ids, logprobs)

    def _forced_rows(
        self, prompt_ids: Sequence[int], target: list[int], got: list[tuple[int, list[tuple[int, float]]]], n: int
    ) -> list[list[tuple[int, float]]] | str:
        """The top log-probabilities at each of the ``n`` positions of ``target``, starting from
        the first reply ``got``: a position stays teacher-forced while the server's tokens follow
        ``target``; where one parts, the next request starts from the target up to there."""
        rows: list[list[tuple[int, float]]] = []
        while True:
            for token, top in got:
                rows.append(top)
                if token != target[len(rows) - 1]:
                    break  # later positions follow the server's own token, not the forced one
            if len(rows) >= n:
                return rows
            next_got = self._top_logprobs([*prompt_ids, *target[: len(rows)]], n - len(rows))
            if isinstance(next_got, str):
                return next_got
            got = next_got

    def _top_logprobs(self, ids: Sequence[int], n: int) -> list[tuple[int, list[tuple[int, float]]]] | str:
        """One non-streaming completion of ``n`` tokens from ``ids`` on llama-server's own
        ``/completion``: (token, [(id, logprob)...]) per generated token, or why not (a string).
        llama-server sends no probabilities for a token that leaves the text an incomplete UTF-8
        character (a byte token): its list is empty (the generated ids come from ``tokens``)."""
        import httpx

        body: dict[str, object] = {
            "prompt": list(ids),
            "n_predict": n,
            "temperature": 0.0,
            "n_probs": TOP_K,
            "return_tokens": True,
            "cache_prompt": True,
            "stream": False,
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        try:
            response = self._client.post(
                self._native_completion_url, json=body, timeout=httpx.Timeout(self.request_timeout_s, connect=5.0)
            )
        except httpx.HTTPError as exc:
            raise EngineError(
                self.redact(f"{self.url}: reading token probabilities: {type(exc).__name__}: {exc}")
            ) from None
        if response.status_code != 200:
            return f"the endpoint has no llama-server /completion with n_probs (HTTP {response.status_code})"
        try:
            data = loads(response.content)
        except DuplicateKey as exc:
            return f"the endpoint's /completion reply has a {exc}"
        except ValueError:
            return "the endpoint sent no token ids with its log-probabilities (llama-server's n_probs)"
        try:
            tokens = [int(t) for t in data["tokens"]]
            entries = [
                (int(e["id"]), [(int(t["id"]), float(t["logprob"])) for t in e["top_logprobs"]])
                for e in data["completion_probabilities"]
            ]
        except (ValueError, KeyError, IndexError, TypeError):
            return "the endpoint sent no token ids with its log-probabilities (llama-server's n_probs)"
        return _aligned(tokens, entries)

    def close(self) -> None:
        self._client.close()


def _aligned(
    tokens: list[int], entries: list[tuple[int, list[tuple[int, float]]]]
) -> list[tuple[int, list[tuple[int, float]]]] | str:
    """(token, its top log-probabilities) per generated token: the entries are the tokens', in
    order, less the byte tokens held back (those get an empty list); or why they do not fit."""
    out: list[tuple[int, list[tuple[int, float]]]] = []
    for token in tokens:
        out.append((token, entries.pop(0)[1] if entries and entries[0][0] == token else []))
    if not out or entries:
        return "the endpoint's log-probabilities do not follow its tokens"
    return out


def _top_arrays(
    rows: Sequence[Sequence[tuple[int, float]]], n: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """(ids, log-probabilities) arrays of ``n`` rows of the widest row's width: the top ids and
    their log-probabilities per position, padded with -1 and -inf."""
    import numpy as np

    k = max(1, *(len(r) for r in rows))
    ids = np.full((n, k), -1, dtype=np.int64)
    logprobs = np.full((n, k), -np.inf)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = [t for t, _ in row]
        logprobs[i, : len(row)] = [lp for _, lp in row]
    return ids, logprobs


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

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _clamp(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _clamp(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> _DeadlineStream:
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, _clamp(timeout)))

    def get_extra_info(self, info: str) -> object:
        return self._stream.get_extra_info(info)


class _DeadlineBackend:
    """httpcore's network backend, with streams and connects bounded by the deadline."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, *args: Any, **kwargs: Any
    ) -> _DeadlineStream:
        return _DeadlineStream(self._backend.connect_tcp(host, port, _clamp(timeout), *args, **kwargs))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, *args: Any, **kwargs: Any
    ) -> _DeadlineStream:
        return _DeadlineStream(self._backend.connect_unix_socket(path, _clamp(timeout), *args, **kwargs))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _deadline_transport(transport: httpx.HTTPTransport) -> httpx.HTTPTransport:
    """``transport`` with its connection pool's network backend wrapped in ``_DeadlineBackend``.

    httpx has no public hook for this; its pool keeps the backend in ``_network_backend``
    (httpcore >= 0.17). tests/test_hostile.py fails if a trickling server outlives the deadline."""
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if pool is None or backend is None:
        raise EngineError("this httpx/httpcore version is not supported (no network backend to bound); pin httpx<1")
    pool._network_backend = _DeadlineBackend(backend)
    return transport


PREFIX = "llamacpp:"
READ_TIMEOUT_S = 2.0
#: Most series kept (a hostile endpoint cannot grow a report without bound).
MAX_SERIES = 256


def parse(text: str) -> dict[str, float]:
    """``{name without prefix: value}`` of the ``llamacpp:`` samples in Prometheus text."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(PREFIX):
            continue
        name, _, rest = line.partition(" ")
        name = name.split("{", 1)[0][len(PREFIX) :]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value) and name:
            values[name] = value
        if len(values) >= MAX_SERIES:
            break
    return values


def read(client: httpx.Client, metrics_url: str) -> dict[str, float] | None:
    """The server's ``llamacpp:`` metrics, or None when it has none (another server, no
    ``--metrics``, unreachable)."""
    import httpx

    try:
        response = client.get(metrics_url, timeout=READ_TIMEOUT_S, headers={"Accept": "text/plain"})
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return parse(response.text[: 1 << 20]) or None


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Counters (``*_total``) as after minus before; gauges as read after."""
    if not before or not after:
        return None
    return {
        name: value - before[name] if name.endswith("_total") else value
        for name, value in after.items()
        if name in before or not name.endswith("_total")
    }
