"""What to measure (the workload), what one run returns (the trace), and what an engine reports
about itself.

What to measure: the prompt, how many tokens to generate, how many runs.

What an engine hands back for one run: raw clock readings and the engine's own counters.

Nothing here is derived: metrics are computed later from these readings, so the timed loop
does no arithmetic and the raw data can be re-analysed.

Describes the engine and model a measurement ran on (report header, baselines), and the llama.cpp
settings of the in-process engine: one entry each (``LLAMA_SETTINGS``), from which the marker keys,
the engine's keywords, its ``llama_cpp.Llama(...)`` call, the fingerprint and the session options
are derived."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, TypeVar

from .errors import ConfigError
from .formats import human_bytes, shown

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: A sequential measurement (runs added while its verdict is undecided, against a baseline or
#: --llmperf-against's REF) stops at this many times its ``runs`` (``max_runs`` overrides); one
#: against a baseline also after ``SEQUENTIAL_TIME_CAP_S`` (--llmperf-against's pairs have their
#: own bound, ``session.against.PAIRS_TIME_CAP_S``).
SEQUENTIAL_FACTOR = 3
SEQUENTIAL_TIME_CAP_S = 120.0

T = TypeVar("T")


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def from_stored(cls: Callable[..., T], data: Mapping[str, object], **nested: Callable[..., object]) -> T:
    """A frozen dataclass from ``dataclasses.asdict`` of it through JSON: arrays back to tuples,
    the ``nested`` fields read by their own types."""
    fields = {k: _tuples(v) for k, v in data.items()}
    for name, kind in nested.items():
        value = data.get(name)
        if isinstance(value, Mapping):
            fields[name] = from_stored(kind, value)
    return cls(**fields)


#: The roles a chat message may have (``messages``).
CHAT_ROLES = ("system", "user", "assistant")


#: One message of a chat request (``Workload.messages``): (role, content).
ChatMessage = tuple[str, str]


def chat_messages(value: object) -> tuple[ChatMessage, ...]:
    """Chat messages as a test gives them (``[{"role": ..., "content": ...}, ...]``; (role,
    content) pairs as a stored workload holds them) checked: a non-empty list, each a known role
    with text content; else a ConfigError, one line naming the message."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}}, got {value!r}")
    return tuple(_chat_message(i, m) for i, m in enumerate(value))


def chat_dicts(messages: tuple[ChatMessage, ...]) -> list[dict[str, str]]:
    """The messages as a chat API takes them: ``[{"role": ..., "content": ...}, ...]``."""
    return [{"role": role, "content": content} for role, content in messages]


def _chat_message(index: int, message: object) -> ChatMessage:
    if isinstance(message, (tuple, list)) and len(message) == 2:  # stored: (role, content), JSON's list
        message = dict(zip(("role", "content"), message))
    if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
        raise ConfigError(f"messages[{index}] must be {{'role': ..., 'content': ...}}, got {message!r}")
    role, content = message["role"], message["content"]
    if role not in CHAT_ROLES:
        raise ConfigError(f"messages[{index}] has role {role!r}; roles: {', '.join(CHAT_ROLES)}")
    if not isinstance(content, str):
        raise ConfigError(f"messages[{index}] content must be a string, got {content!r}")
    _check_encodable(content)
    return (str(role), content)


#: What one request of a prompt set may give (``SetRequest``): a prompt or messages, the rest optional.
SET_REQUEST_KEYS = ("prompt", "messages", "max_tokens", "weight")


class SetRequest(NamedTuple):
    """One request of a prompt set (``Workload.prompt_set``): literal prompt text or chat
    messages, its own ``max_tokens`` (None: the workload's) and its ``weight`` (its share of the
    draws, relative to the others'). A tuple, as ``ChatMessage`` is (no new shape): a stored
    workload holds it as ``[prompt, messages, max_tokens, weight]``."""

    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    max_tokens: int | None = None
    weight: float = 1.0

    def to_line(self) -> dict[str, object]:
        """The request as a JSONL line gives it (``set_request`` reads it back): only what is set."""
        line: dict[str, object] = (
            {"messages": chat_dicts(self.messages)} if self.messages is not None else {"prompt": self.prompt}
        )
        if self.max_tokens is not None:
            line["max_tokens"] = self.max_tokens
        if self.weight != 1.0:
            line["weight"] = self.weight
        return line


def set_request(value: object) -> SetRequest:
    """One request of a prompt set as a file's line or an inline list gives it (keys
    ``SET_REQUEST_KEYS``; null as absent) checked; else a ConfigError, one line."""
    if isinstance(value, (tuple, list)) and len(value) == len(SET_REQUEST_KEYS):  # stored: JSON's list
        value = dict(zip(SET_REQUEST_KEYS, value))
    if not isinstance(value, Mapping):
        raise ConfigError(f'a request must be an object such as {{"prompt": ...}}, got {value!r}')
    unknown = [k for k in value if k not in SET_REQUEST_KEYS]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; a request's keys: {', '.join(SET_REQUEST_KEYS)}")
    given = {k: v for k, v in value.items() if v is not None}
    if ("prompt" in given) == ("messages" in given):
        raise ConfigError("a request needs either a prompt or messages (one of them)")
    prompt = given.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise ConfigError(f"prompt must be a non-empty string, got {prompt!r}")
    if prompt is not None:
        _check_encodable(prompt)
    max_tokens, weight = given.get("max_tokens"), given.get("weight", 1.0)
    if max_tokens is not None and (type(max_tokens) is not int or not 2 <= max_tokens <= MAX_TOKENS):
        raise ConfigError(f"max_tokens must be an integer from 2 to {MAX_TOKENS}, got {max_tokens!r}")
    if type(weight) not in (int, float) or not (math.isfinite(weight) and weight > 0):
        raise ConfigError(f"weight must be a number > 0, got {weight!r}")
    messages = chat_messages(given["messages"]) if "messages" in given else None
    return SetRequest(prompt=prompt, messages=messages, max_tokens=max_tokens, weight=float(weight))


def prompt_set_requests(value: object) -> tuple[SetRequest, ...]:
    """A prompt set given inline (a list of requests; as stored: ``SetRequest``s or JSON's lists)
    checked; else a ConfigError, one line naming the request by its index."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"a prompt set must be a non-empty list of requests (or a JSONL file), got {value!r}")
    return read_each(((f"prompt_set[{i}]", item) for i, item in enumerate(value)), set_request)


def read_each(
    items: Iterable[tuple[str, object]], read: Callable[[object], T], check: Callable[[list[T]], None] | None = None
) -> tuple[T, ...]:
    """Each ``(where, value)`` of ``items`` read by ``read``, the values so far checked by ``check``
    after each: a ConfigError of one is ``where: ...`` (a set's or a trace's lines, inline or JSONL)."""
    out: list[T] = []
    for where, value in items:
        try:
            out.append(read(value))
            if check is not None:
                check(out)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return tuple(out)


def prompt_set_digest(requests: tuple[SetRequest, ...]) -> str:
    """The set's content hash: sha256 of the canonical JSON of its requests (``to_line``)."""
    text = json.dumps([r.to_line() for r in requests], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def drawn(requests: tuple[SetRequest, ...], seed: int, run_index: int) -> int:
    """The index of the request run ``run_index`` sends: a draw by the requests' weights, a pure
    function of (set, seed, run index), so every side and session sees the same order."""
    cumulative = list(itertools.accumulate(r.weight for r in requests))
    digest = hashlib.sha256(f"{seed}:{run_index}".encode()).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64 * cumulative[-1]
    return min(bisect_right(cumulative, point), len(requests) - 1)


#: What one line of a trace may give (``TraceRequest``): its arrival time, then a request's keys
#: (``SET_REQUEST_KEYS`` but ``weight``: a trace's requests are sent once each, in order).
TRACE_KEYS = ("t_s", "prompt", "messages", "max_tokens")


class TraceRequest(NamedTuple):
    """One request of a trace (``Workload.trace``): when it arrived, in seconds on the trace's
    own clock (``t_s``; replayed as offsets from the first line's), and the request (a
    ``SetRequest``, read by ``set_request``: prompt or messages, optional ``max_tokens``). A
    tuple, as ``SetRequest`` is: a stored workload holds it as ``[t_s, [prompt, messages,
    max_tokens, weight]]``."""

    t_s: float
    request: SetRequest

    def to_line(self) -> dict[str, object]:
        """The request as a trace's JSONL line gives it (``trace_request`` reads it back)."""
        return {"t_s": self.t_s, **self.request.to_line()}


def trace_request(value: object) -> TraceRequest:
    """One line of a trace (keys ``TRACE_KEYS``; as stored: ``[t_s, request]``) checked; else a
    ConfigError, one line."""
    if isinstance(value, (tuple, list)) and len(value) == 2:  # stored: JSON's list
        value = {"t_s": value[0], **set_request(value[1]).to_line()}
    if not isinstance(value, Mapping):
        raise ConfigError(f'a trace line must be an object such as {{"t_s": 0.0, "prompt": ...}}, got {value!r}')
    unknown = [k for k in value if k not in TRACE_KEYS]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; a trace line's keys: {', '.join(TRACE_KEYS)}")
    if "t_s" not in value:
        raise ConfigError('a trace line needs its arrival time "t_s" (seconds)')
    t_s = value["t_s"]
    if type(t_s) not in (int, float) or not math.isfinite(t_s) or t_s < 0:
        raise ConfigError(f"t_s must be a number of seconds >= 0, got {t_s!r}")
    return TraceRequest(float(t_s), set_request({k: v for k, v in value.items() if k != "t_s"}))


def trace_requests(value: object) -> tuple[TraceRequest, ...]:
    """A trace given inline (a list of lines; as stored: ``TraceRequest``s or JSON's lists)
    checked, its arrival times in order; else a ConfigError naming the line by its index."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"a trace must be a non-empty list of requests with t_s (or a JSONL file), got {value!r}")
    return read_each(((f"trace[{i}]", item) for i, item in enumerate(value)), trace_request, check_arrival)


def check_arrival(lines: list[TraceRequest]) -> None:
    """The last line's arrival time is not before the one before it (a trace is replayed in
    its order, never re-sorted: request i is line i); else a ConfigError."""
    if len(lines) > 1 and lines[-1].t_s < lines[-2].t_s:
        raise ConfigError(
            f"t_s {lines[-1].t_s:g} goes backwards (the line before: {lines[-2].t_s:g}); "
            "a trace's lines are in arrival order: sort it by t_s"
        )


class SentRequest(NamedTuple):
    """One request an engine sent to its server (``engines.capabilities.SentRequests``): when the client
    began it (``time.perf_counter_ns``) and what it asked, as a trace's line holds it."""

    sent_ns: int
    request: SetRequest


def trace_digest(lines: tuple[TraceRequest, ...]) -> str:
    """The trace's content hash: sha256 of the canonical JSON of its lines (``to_line``)."""
    text = json.dumps([r.to_line() for r in lines], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


#: What a conversation given as an object may hold (``Conversation``): its user turns, and
#: optionally the system message every turn's chat starts with.
CONVERSATION_KEYS = ("system", "turns")


class Conversation(NamedTuple):
    """A multi-turn conversation (``Workload.conversation``): the user's turns, in order, and
    an optional system message. One run sends every turn, turn k's chat being the system
    message, the user turns 1..k and the replies the model made to turns 1..k-1 (``messages``).
    A tuple, as ``SetRequest`` is (no new shape): stored as ``[turns, system]``."""

    turns: tuple[str, ...]
    system: str | None = None

    def messages(self, replies: tuple[str, ...] | list[str]) -> tuple[ChatMessage, ...]:
        """Turn ``len(replies) + 1``'s chat: the system message, each earlier user turn and its
        reply, then this turn's user message."""
        k = len(replies) + 1
        if k > len(self.turns):
            raise ValueError(f"a conversation of {len(self.turns)} turns has no turn {k}")
        out: list[ChatMessage] = [("system", self.system)] if self.system is not None else []
        for turn, reply in zip(self.turns, replies):
            out += [("user", turn), ("assistant", reply)]
        return (*out, ("user", self.turns[k - 1]))

    def to_line(self) -> dict[str, object]:
        """The conversation as a file gives it (``conversation_of`` reads it back)."""
        out: dict[str, object] = {"turns": list(self.turns)}
        if self.system is not None:
            out["system"] = self.system
        return out


def conversation_of(value: object) -> Conversation:
    """A conversation as a test gives it inline: a list of user turns (strings) or an object
    ``{"system": ..., "turns": [...]}`` (as stored: a ``Conversation`` or JSON's ``[turns,
    system]``) checked; else a ConfigError, one line naming the turn by its index."""
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], (tuple, list)):
        value = dict(zip(("turns", "system"), value))  # stored
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in CONVERSATION_KEYS]
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r}; a conversation's keys: {', '.join(CONVERSATION_KEYS)}")
        system, turns = value.get("system"), value.get("turns")
        if system is not None and not isinstance(system, str):
            raise ConfigError(f"a conversation's system message must be a string, got {system!r}")
        if system is not None:
            _check_encodable(system)
    else:
        system, turns = None, value
    if isinstance(turns, (str, bytes)) or not isinstance(turns, (list, tuple)) or not turns:
        raise ConfigError(f"a conversation's turns must be a non-empty list of user messages (strings), got {turns!r}")
    for i, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn:
            raise ConfigError(f"turns[{i}] must be a non-empty string (a user message), got {turn!r}")
        _check_encodable(turn)
    return Conversation(turns=tuple(turns), system=system)


def conversation_digest(conversation: Conversation) -> str:
    """The conversation's content hash: sha256 of its canonical JSON (``to_line``)."""
    text = json.dumps(conversation.to_line(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


#: Workload fields newer than the stored form's first version: left out of ``to_json`` when None.
LATER_FIELDS = frozenset({"messages", "prompt_set", "trace", "trace_speed", "conversation", "turn"})


@dataclass(frozen=True)
class Workload:
    """One measurement's request shape and repetition.

    Exactly one of ``prompt`` (literal text, tokenized by the engine), ``messages`` (a chat
    request: rendered through the model's chat template, or sent to a server's
    ``/v1/chat/completions``) and ``prompt_tokens`` (a synthetic prompt of exactly that many
    tokens, seeded) is used; with none, the default is a synthetic prompt of
    ``DEFAULT_PROMPT_TOKENS``. A ``prompt_set`` instead: each run sends one of its requests,
    drawn by ``request(run_index)``.
    """

    prompt: str | None = None
    prompt_tokens: int | None = None
    messages: tuple[ChatMessage, ...] | None = None
    prompt_set: tuple[SetRequest, ...] | None = None
    max_tokens: int = 64
    runs: int = 20
    warmup: int = 1
    seed: int = 0
    # Load (served models): requests in flight at once, total requests (default: runs), and
    # Poisson arrivals at ``rate`` requests/s (seeded). Any of them set = a load test.
    concurrency: int | None = None
    requests: int | None = None
    rate: float | None = None
    # Served models: the first N words of every request's synthetic prompt are the same (the
    # rest differ), to measure prefix caching on purpose. None: every prompt unique, and the
    # server asked not to reuse cached prompts (llama-server's cache_prompt=false).
    shared_prefix_tokens: int | None = None
    # A measured callable's Llamas between runs (``PROMPT_CACHE_MODES``): "cold" clears what the
    # previous run left (every run a new request), "warm" keeps it (measures what the cache gives).
    prompt_cache: str = "cold"
    # Served: a trace replayed at its recorded pace (``trace_speed`` times faster; None: 1.0),
    # each request sent at its arrival time whatever the server's backlog (open loop).
    trace: tuple[TraceRequest, ...] | None = None
    trace_speed: float | None = None
    #: A multi-turn conversation instead of one prompt: each run sends its turns in order, the
    #: model's replies fed back and the prompt cache kept between them (cleared before turn 1).
    conversation: Conversation | None = None
    #: One turn of ``conversation`` (1-based): the one a test's budgets and judged figures read
    #: (the ``turn`` key; None: every turn pooled), and the one an engine is asked for (``at_turn``).
    turn: int | None = None

    def to_json(self) -> dict[str, object]:
        """Every field (what an engine worker or a side is sent), but the newer request forms
        when unset (``LATER_FIELDS``: a ``--llmperf-against`` REF of an older version reads the
        rest); ``from_json`` reads it."""
        return {k: v for k, v in dataclasses.asdict(self).items() if not (k in LATER_FIELDS and v is None)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Workload:
        return from_stored(cls, data)

    def __post_init__(self) -> None:
        if self.messages is not None:  # a list of dicts from a marker or JSON: checked, then hashable
            object.__setattr__(self, "messages", chat_messages(self.messages))
        if self.prompt_set is not None:  # requests as dicts (JSON): checked, then SetRequests
            object.__setattr__(self, "prompt_set", prompt_set_requests(self.prompt_set))
        if self.trace is not None:  # lines as dicts (JSON): checked, then TraceRequests
            object.__setattr__(self, "trace", trace_requests(self.trace))
            self._check_trace()
        elif self.trace_speed is not None:
            raise ConfigError("trace_speed scales a trace's arrival times: give a trace too")
        if self.conversation is not None:  # a list or object (JSON): checked, then a Conversation
            object.__setattr__(self, "conversation", conversation_of(self.conversation))
        if self.turn is not None and not (self.conversation is not None and 1 <= self.turn <= self.turns):
            raise ConfigError(f"turn {self.turn} needs a conversation of at least {self.turn} turns")
        if self.prompt_cache not in PROMPT_CACHE_MODES:
            raise ConfigError(f"prompt_cache must be one of {', '.join(PROMPT_CACHE_MODES)}, got {self.prompt_cache!r}")
        self._check_prompt()
        self._check_counts()
        if self.shared_prefix_tokens is not None:
            self._check_shared_prefix(self.shared_prefix_tokens)

    def _check_prompt(self) -> None:
        """A literal prompt (not empty, encodable) or a synthetic prompt's length, not both."""
        if self.prompt is not None and self.prompt_tokens is not None:
            raise ConfigError("give either prompt or prompt_tokens, not both")
        if self.messages is not None and (self.prompt is not None or self.prompt_tokens is not None):
            raise ConfigError("give either messages or a prompt (prompt, prompt_tokens), not both")
        if self.prompt_set is not None and (self.prompt, self.prompt_tokens, self.messages) != (None, None, None):
            raise ConfigError("give either a prompt_set or one prompt (prompt, prompt_tokens, messages), not both")
        if self.conversation is not None and (
            (self.prompt, self.prompt_tokens, self.messages, self.prompt_set, self.trace) != (None,) * 5
        ):
            raise ConfigError(
                "give either a conversation or a prompt (prompt, prompt_tokens, messages, prompt_set, trace)"
            )
        if self.prompt_tokens is not None and self.prompt_tokens < 1:
            raise ConfigError(f"prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.prompt is not None and not self.prompt:
            raise ConfigError("prompt must not be empty")
        if self.prompt is not None:
            _check_encodable(self.prompt)

    def _check_trace(self) -> None:
        """A trace is the whole request stream: no prompt of another kind, no load keys of its
        own (its lines give the requests and their arrivals), a positive speed."""
        if (self.prompt, self.prompt_tokens, self.messages, self.prompt_set) != (None, None, None, None):
            raise ConfigError("give either a trace or a prompt (prompt, prompt_tokens, messages, prompt_set), not both")
        given = [k for k in ("concurrency", "requests", "rate") if getattr(self, k) is not None]
        if given:
            raise ConfigError(
                f"a trace gives its own requests and arrival times: drop {', '.join(given)} "
                "(trace_speed scales its pace)"
            )
        speed = self.trace_speed
        if speed is not None and (type(speed) not in (int, float) or not (math.isfinite(speed) and speed > 0)):
            raise ConfigError(f"trace_speed must be a number > 0 (2.0: twice as fast), got {speed!r}")

    @property
    def trace_offsets_s(self) -> tuple[float, ...]:
        """When each request of the trace is sent, seconds after the first: its arrival times
        from the first line's, divided by ``trace_speed``."""
        if self.trace is None:
            return ()
        first, speed = self.trace[0].t_s, self.trace_speed or 1.0
        return tuple((r.t_s - first) / speed for r in self.trace)

    def _check_counts(self) -> None:
        """Token counts within ``MAX_TOKENS``, every count at its floor (``COUNT_FLOORS``), a
        positive arrival rate."""
        for name in ("prompt_tokens", "max_tokens"):
            value = getattr(self, name)
            if value is not None and value > MAX_TOKENS:
                raise ConfigError(f"{name} {too_many(value)}")
        for name, low, why in COUNT_FLOORS:
            value = getattr(self, name)
            if value is not None and value < low:
                raise ConfigError(f"{name} must be >= {low}{why}, got {value}")
        if self.rate is not None and not self.rate > 0:
            raise ConfigError(f"rate must be > 0 requests/s, got {self.rate}")

    def _check_shared_prefix(self, shared: int) -> None:
        """A shared prefix shorter than the synthetic prompt it starts."""
        total = self.synthetic_prompt_tokens
        if total is None:
            raise ConfigError("shared_prefix_tokens needs a synthetic prompt (prompt_tokens), not a literal prompt")
        if not 1 <= shared < total:
            raise ConfigError(
                f"shared_prefix_tokens must be between 1 and prompt_tokens - 1 ({total - 1}), got {shared}"
            )

    def request(self, run_index: int) -> Workload:
        """The workload run ``run_index`` sends (warm-ups: negative indexes): with a prompt set,
        its drawn request's prompt or messages and max_tokens (``drawn``); else this one."""
        if self.trace is not None:  # request i is line i; warm-up k (index -1 - k) sends line k
            i = run_index if run_index >= 0 else -1 - run_index
            return self._sending(self.trace[i % len(self.trace)].request)
        if self.prompt_set is None:
            return self
        return self._sending(self.prompt_set[drawn(self.prompt_set, self.seed, run_index)])

    def each_request(self) -> tuple[Workload, ...]:
        """Each request of the prompt set as a run sends it (without a set: this one)."""
        if self.trace is not None:
            return tuple(self._sending(r.request) for r in self.trace)
        if self.prompt_set is None:
            return (self,)
        return tuple(self._sending(r) for r in self.prompt_set)

    def _sending(self, r: SetRequest) -> Workload:
        return dataclasses.replace(
            self,
            prompt_set=None,
            trace=None,
            trace_speed=None,
            prompt=r.prompt,
            messages=r.messages,
            max_tokens=r.max_tokens or self.max_tokens,
        )

    def at_turn(self, turn: int) -> Workload:
        """What an engine is sent for turn ``turn`` (1-based) of a conversation: the whole
        conversation and the turn (an engine keeps the replies it made to the run's earlier turns)."""
        return dataclasses.replace(self, turn=turn)

    @property
    def turns(self) -> int:
        """Requests one run sends: a conversation's turns, else 1."""
        return len(self.conversation.turns) if self.conversation is not None else 1

    @property
    def is_load(self) -> bool:
        """A load test: several requests, possibly concurrent, summarized per request."""
        return self.concurrency is not None or self.requests is not None or self.rate is not None or self.is_trace

    @property
    def is_trace(self) -> bool:
        """A trace replay: a load test whose requests and arrival times are the trace's."""
        return self.trace is not None

    @property
    def n_requests(self) -> int:
        if self.trace is not None:
            return len(self.trace)
        return self.requests if self.requests is not None else self.runs

    @property
    def synthetic_prompt_tokens(self) -> int | None:
        """Token count of the synthetic prompt, or None for a literal prompt, chat messages or a set."""
        if (self.prompt, self.messages, self.prompt_set, self.trace, self.conversation) != (None,) * 5:
            return None
        return self.prompt_tokens if self.prompt_tokens is not None else DEFAULT_PROMPT_TOKENS

    @property
    def served_cache_note(self) -> str:
        """What a served measurement lets the server's prompt cache do (said in reports)."""
        if self.shared_prefix_tokens:
            return f"shared {self.shared_prefix_tokens}-token prefix, prompt cache on (measures prefix caching)"
        if self.conversation is not None:
            return "a conversation: turn 1 cache_prompt=false, later turns cache_prompt=true (reuse measured)"
        if self.prompt_set is not None:
            return "the prompt set's requests, prompt cache off (cache_prompt=false)"
        if self.trace is not None:
            return "the trace's requests, prompt cache off (cache_prompt=false)"
        if self.prompt is not None or self.messages is not None:
            return "same literal prompt every request, prompt cache off (cache_prompt=false)"
        return "unique prompts, prompt cache off (cache_prompt=false)"

    def describe(self) -> str:
        if self.trace is not None:
            return self._describe_trace(self.trace)
        if self.conversation is not None:
            source = f"conversation of {len(self.conversation.turns)} turns" + (
                f" (turn {self.turn} judged)" if self.turn is not None else ""
            )
        elif self.prompt_set is not None:
            source = f"prompt set of {len(self.prompt_set)} requests"
        elif self.messages is not None:
            source = f"chat {len(self.messages)} messages"
        elif self.prompt is not None:
            source = f"prompt {len(self.prompt)} chars"
        else:
            source = f"{self.synthetic_prompt_tokens} prompt tokens"
        if self.shared_prefix_tokens:
            source += f" ({self.shared_prefix_tokens} shared)"
        if self.is_load:
            pace = f"Poisson {self.rate:g}/s" if self.rate else "closed loop"
            return (
                f"{source}, {self.max_tokens} generated, {self.n_requests} requests, "
                f"concurrency {self.concurrency or 1}, {pace} (+{self.warmup} warm-up)"
            )
        return f"{source}, {self.max_tokens} generated, {self.runs} runs (+{self.warmup} warm-up)"

    def _describe_trace(self, trace: tuple[TraceRequest, ...]) -> str:
        span_s = trace[-1].t_s - trace[0].t_s  # on the trace's own clock
        return (
            f"trace of {len(trace)} requests over {span_s:.3g} s, replayed at {self.trace_speed or 1.0:g}x "
            f"its pace, open loop (+{self.warmup} warm-up)"
        )


DEFAULT_PROMPT_TOKENS = 64

#: A measured callable's prompt cache between runs (the ``prompt_cache`` marker key and session
#: option): cleared before every run (the default), or kept.
PROMPT_CACHE_MODES = ("cold", "warm")

#: A workload's counts and their floors, in the order they are checked: (field, lowest, why).
COUNT_FLOORS = (
    ("max_tokens", 2, " (decode latency needs two tokens)"),
    ("runs", 1, ""),
    ("warmup", 0, ""),
    ("concurrency", 1, ""),
    ("requests", 1, ""),
)

#: What fresh model loads a test may ask for (the ``model_load`` marker key): the model file in
#: the page cache, or evicted from it before each load.
MODEL_LOAD_KINDS = ("warm", "cold")

#: The session header's word on prompt caching for served models (each test's own choice is
#: ``Workload.prompt_cache``, in its metrics table).
PROMPT_CACHE_NOTE = (
    "prompt cache: every request's prompt unique, cache_prompt=false; tests with "
    "shared_prefix_tokens measure prefix caching (cache_prompt=true)"
)

#: Bound on ``prompt_tokens`` and ``max_tokens``: 2**24 is beyond every model's context, and
#: an engine may build arrays of this size before the server or llama.cpp can say no.
MAX_TOKENS = 2**24


def too_many(value: int) -> str:
    """The bound of every token count (prompt, generated, llama.cpp's context and batch), as
    the message's tail: "must be <= 16777216 (...), got N"."""
    return f"must be <= {MAX_TOKENS} (more than any model's context), got {shown(value)}"


def _check_encodable(prompt: str) -> None:
    """Engines send the prompt as UTF-8: a lone surrogate (``'\\ud800'``) cannot be sent."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"prompt is not valid text: {exc.object[exc.start : exc.end]!r} at index {exc.start} "
            "cannot be encoded as UTF-8 (a lone surrogate); fix the prompt string"
        ) from None


@dataclass(frozen=True)
class NativeCounters:
    """llama.cpp's own timings for one run (``llama_perf_context`` after a reset)."""

    prefill_ms: float
    prefill_tokens: int
    decode_ms: float
    decode_tokens: int
    #: llama.cpp's sampler counters (``llama_perf_sampler``): time in the sampler chain and calls.
    sample_ms: float | None = None
    sample_count: int = 0
    #: The sampler ran between the run's clock reads (its time is part of TPOT); False: the
    #: engine fed seeded tokens and timed sampling apart, after the run.
    sampled_in_run: bool = True
    #: Where the counters come from, as the parts of a comparison name it.
    source: str = "llama_perf_context"
    #: What llama.cpp's sampler chain held beyond the usual samplers ("grammar"; "": nothing more).
    sampler: str = ""

    @property
    def sample_ms_per_token(self) -> float | None:
        return self.sample_ms / self.sample_count if self.sample_count and self.sample_ms is not None else None

    @property
    def decode_ms_per_token(self) -> float | None:
        return self.decode_ms / self.decode_tokens if self.decode_tokens else None

    @property
    def sampling_in_tpot_ms(self) -> float:
        """The sampler's time per token that lies inside TPOT (0 when it was timed apart)."""
        per_token = self.sample_ms_per_token
        return per_token if self.sampled_in_run and per_token is not None else 0.0


@dataclass(frozen=True)
class RunTrace:
    """Clock readings (``time.perf_counter_ns``) of one run, all in the driving process.

    ``start_ns``: the first engine call (prefill starts, or the request is sent);
    ``prefill_done_ns``: the engine finished evaluating the prompt (None if it cannot tell);
    ``token_ns``: when each generated token became available to the caller;
    ``tokenize_ns``: how long tokenizing a literal prompt took, just before ``start_ns``
    (it counts towards TTFT and E2E, as the caller waits for it).
    """

    start_ns: int
    prefill_done_ns: int | None
    token_ns: tuple[int, ...]
    prompt_tokens: int | None
    tokenize_ns: int = 0
    native: NativeCounters | None = None
    token_ids: tuple[int, ...] = ()
    #: When each item of a callable's stream reached the caller, where ``token_ns`` are the
    #: tokens as llama.cpp made them (a callable on a Llama the plugin sees); empty: ``token_ns``
    #: are what the caller received.
    delivered_ns: tuple[int, ...] = ()
    #: The prompt's tokens llama.cpp did not evaluate (a prompt cache held them); None: unknown.
    prompt_reused_tokens: int | None = None
    #: Tokenization inside ``start_ns``..``token_ns[0]`` (a callable's own, timed by the plugin),
    #: part of TTFT already: only the tokenization part reads it.
    tokenize_in_run_ns: int = 0
    #: The user's Python logits processors and stopping criteria, ns in all (None: none ran or unknown).
    python_sampling_ns: int | None = None
    #: Which turn of a conversation this run is (1-based; None: not a conversation).
    turn: int | None = None
    #: llama.cpp generations in the run that made tokens (a callable's pipeline: a router's call,
    #: then the answer's): ``token_ns`` are the one's that made the most, the others inside them.
    generations: int = 1

    def to_json(self) -> dict[str, object]:
        """Every field (what an engine worker or a side sends back); ``from_json`` reads it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RunTrace:
        return from_stored(cls, data, native=NativeCounters)


@dataclass(frozen=True)
class LlamaRun:
    """One ``llama_cpp.Llama``'s part of one run of a measured callable, read after it
    (``engines.user_llama``): what it was asked, evaluated and made, and its counters."""

    name: str
    prompt_tokens: int | None
    evaluated_prompt_tokens: int | None
    prefill_done_ns: int | None
    made_ns: tuple[int, ...]  # each generated token (end of generation excluded), when sampled
    native: NativeCounters | None
    python_sampling_ns: int  # the user's logits processors and stopping criteria
    tokenize_ns: int  # tokenization inside the run, before the prompt's evaluation
    #: Generations (``generate`` calls) in the run that made tokens: the one that made the most
    #: is the one above (its prompt, tokens and counters), the others' work inside its clock.
    generations: int = 1

    @property
    def reused_prompt_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.evaluated_prompt_tokens is None:
            return None
        return max(self.prompt_tokens - self.evaluated_prompt_tokens, 0)


@dataclass(frozen=True)
class TokenLogits:
    """One prompt as an engine that exposes token probabilities sees it, outside every timed
    region (``measuring.agreement``): the prompt's ids, the model's greedy continuation (end of
    generation banned, as in the runs) and, teacher-forced on the ids it was given (its own
    greedy ones when none), the next-token logits at each generated position: a float32 array,
    positions x vocabulary, row j the scores of token j given the prompt and tokens 0..j-1.

    A served model gives only its top-k instead (``logits`` None): ``top_ids`` and
    ``top_logprobs``, positions x k, the k most likely next tokens and their log-probabilities
    under the whole distribution (an id of -1: fewer were sent)."""

    prompt_ids: tuple[int, ...]
    greedy_ids: tuple[int, ...]
    logits: npt.NDArray[np.float32] | None  # (n, n_vocab); numpy is not imported here
    top_ids: npt.NDArray[np.int64] | None = None  # (n, k)
    top_logprobs: npt.NDArray[np.float64] | None = None  # (n, k)


#: ``EngineInfo``'s memory figures, MiB: llama.cpp's reported buffers (its log) and the model
#: file's mapping in the engine's process (/proc/self/smaps).
MEMORY_FIELDS = ("kv_mib", "compute_mib", "output_mib", "model_buffer_mib", "mapped_mib", "mapped_resident_mib")


@dataclass(frozen=True)
class EngineInfo:
    """Static facts about an engine: which backend, which model, which settings."""

    engine: str
    model: str
    model_path: str | None = None
    model_size_bytes: int | None = None
    n_params: int | None = None
    quantization: str | None = None
    n_layer: int | None = None
    n_embd: int | None = None
    n_head: int | None = None
    n_head_kv: int | None = None
    kv_bytes_per_element: float | None = None  # K and V cache type (F16: 2)
    # The token-embedding table when it is only looked up (output has its own weights): a token
    # reads one row of it and does no FLOPs with it. (0, 0) when tied; None when unknown.
    embedding_lookup_params: int | None = None
    embedding_lookup_bytes: int | None = None
    threads: int | None = None
    n_ctx: int | None = None
    n_batch: int | None = None
    gpu_layers: int | None = None
    # llama.cpp settings beyond threads/n_ctx/n_batch (LLAMA_SETTINGS below); None: not llama.cpp
    n_ubatch: int | None = None
    flash_attn: bool | None = None
    type_k: str | None = None
    type_v: str | None = None
    mmap: bool | None = None
    mlock: bool | None = None
    offload_kqv: bool | None = None
    sample: bool | None = None  # greedy sampling inside the timed decode loop
    repack: bool | None = None  # llama.cpp use_extra_bufts (weight repacking, AMX kernels)
    repack_note: str | None = None  # why repack is not llama.cpp's default (the AMX workaround)
    load_ms: float | None = None  # wall time of loading the model and its first context
    native_load_ms: float | None = None
    #: The throw-away first evaluation after load (the first decode is the slow one), ms.
    first_eval_ms: float | None = None
    # Memory, MiB: the buffers of the context the runs use and the model's, as llama.cpp reports
    # them (its log); the model file's mapping in the engine's process (/proc/self/smaps).
    kv_mib: float | None = None
    compute_mib: float | None = None
    output_mib: float | None = None
    model_buffer_mib: float | None = None
    mapped_mib: float | None = None
    mapped_resident_mib: float | None = None
    backend_version: str | None = None
    endpoint: str | None = None  # served models: the API base URL (never the API key)
    token_count: str | None = None  # served models: token counts from "usage" or "events"
    #: A callable's: the ``llama_cpp.Llama`` objects it drove, by name (the settings above are
    #: the first one's).
    llamas: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "llamas", tuple(self.llamas))  # a list from JSON: hashable again

    def describe(self) -> str:
        parts = (
            human_bytes(self.model_size_bytes) if self.model_size_bytes is not None else "",
            self.quantization,
            f"{self.n_params / 1e6:.1f} M params" if self.n_params is not None else "",
            f"{self.n_layer} layers" if self.n_layer is not None else "",
            f"at {self.endpoint}" if self.endpoint else "",
            f"tokens counted from {self.token_count}" if self.token_count else "",
        )
        return ", ".join([self.model, *(p for p in parts if p)])

    def kv_bytes_per_position(self) -> float | None:
        """Bytes of K and V cache one context position takes across all layers (None: the
        engine does not say the model's shape)."""
        n_layer, n_kv, per_element = self.n_layer, self.n_head_kv, self.kv_bytes_per_element
        if n_layer is None or not self.n_head or n_kv is None or self.n_embd is None or per_element is None:
            return None
        return 2 * n_layer * n_kv * (self.n_embd // self.n_head) * per_element


def kv_cache_bytes(info: EngineInfo) -> int | None:
    """The KV cache llama.cpp allocates for the whole context (n_ctx positions)."""
    per_pos = info.kv_bytes_per_position()
    return None if per_pos is None or info.n_ctx is None else int(per_pos * info.n_ctx)


# -- the llama.cpp settings: one entry each ----------------------------------------------------

#: A llama.cpp setting's kind of value: its one parser (the option's) and checker (the marker's)
#: follow from it (``settings.VALUE_KINDS``, ``core.values``).
ValueKind = Literal["count", "tokens", "gpu_layers", "flag", "cache_type"]

#: n_ctx None (auto): the context is sized to each workload, prompt + generated tokens rounded
#: up to this step, as llama-bench sizes its context (llama.cpp pads the cache to 256 anyway).
AUTO_CTX_STEP = 256


def ggml_type(name: str) -> int:
    """llama.cpp's enum value of a cache type name (``q8_0`` -> 8)."""
    from gguf import GGMLQuantizationType

    return int(GGMLQuantizationType[name.upper()])


@dataclass(frozen=True)
class LlamaSetting:
    """One llama.cpp setting of the in-process engine. From this entry alone it is a marker key
    of kind "engine" (and an A/B side's key), a keyword of ``LlamaCppEngine`` and
    ``llmperf.measure()``, the ``llama_cpp.Llama(...)`` keywords or model parameter it sets, a key
    of the subject fingerprint and, with ``option``, a session setting (``--llmperf-<name>``,
    ``$LLMPERF_<NAME>``, ini ``llmperf_<name>``, the ``llmperf`` flag ``--<name>``). Typed fields
    of ``EngineConfig``, ``EngineInfo`` (and, with ``option``, ``EngineSettings``) and a row of
    docs/engine-settings.md carry its name too: tests/test_engine_keys.py names a missing one."""

    name: str
    kind: ValueKind
    default: object
    help: str  # the marker key's help
    llama: tuple[str, ...] = ()  # the ``llama_cpp.Llama(...)`` keywords it sets
    model_param: str | None = None  # a ``llama_model_params`` field ``Llama(...)`` has no keyword for
    to_llama: Callable[[object, Mapping[str, object]], object] | None = None  # (value, all settings) -> llama.cpp's
    not_llama: str | None = None  # why it sets nothing of llama.cpp's (the engine itself reads it)
    stored: str | None = None  # its key in the subject fingerprint (stored records), if not ``name``
    label: str | None = None  # how a changed subject names it, if not ``name``
    fingerprint: bool = True  # part of the engine's identity in baselines and history
    newer: bool = True  # added after baselines were first recorded: a record without it is not changed
    option: str | None = None  # the session setting's help; None: marker, measure() and keywords only
    shown: str | None = None  # how help texts write the default, when the value says too little

    @property
    def subject_key(self) -> str:
        return self.stored or self.name

    def llama_value(self, settings: Mapping[str, object]) -> object:
        """The value llama.cpp is given, from every setting's value (``settings``)."""
        value = settings[self.name]
        return self.to_llama(value, settings) if self.to_llama is not None else value


#: In the order the marker's help and the session's options list them.
LLAMA_SETTINGS: dict[str, LlamaSetting] = {
    s.name: s
    for s in (
        LlamaSetting(
            "threads",
            "count",
            None,  # the engine resolves it: every usable CPU (llama-cpp-python's own default is half)
            "llama.cpp threads for this test (prompt and generation)",
            llama=("n_threads", "n_threads_batch"),
            stored="n_threads",
            newer=False,
            option="llama.cpp threads",
            shown="all usable CPUs",
        ),
        LlamaSetting(
            "n_ctx",
            "tokens",
            None,  # sized to each workload (prompt + generated, rounded up to 256), as llama-bench does
            "llama.cpp context size for this test",
            llama=("n_ctx",),
            to_llama=lambda value, _: value or AUTO_CTX_STEP,
            newer=False,
            option="llama.cpp context size",
            shown=f"each workload's prompt + generated tokens, rounded up to {AUTO_CTX_STEP}",
        ),
        LlamaSetting(
            "n_batch",
            "tokens",
            512,
            "llama.cpp logical batch (prompt tokens per llama_decode call)",
            llama=("n_batch",),
            newer=False,
            option="llama.cpp batch size for prompt evaluation",
        ),
        LlamaSetting(
            "n_ubatch",
            "tokens",
            None,  # n_batch
            "llama.cpp physical micro-batch (<= n_batch; default n_batch)",
            llama=("n_ubatch",),
            to_llama=lambda value, settings: value or settings["n_batch"],
        ),
        LlamaSetting(
            "flash_attn",
            "flag",
            True,  # what llama-bench's default (auto) resolves to on the CPU backend
            "llama.cpp flash attention on/off",
            llama=("flash_attn",),
            label="flash attention",
        ),
        LlamaSetting(
            "type_k",
            "cache_type",
            "f16",
            "K cache type: f16, q8_0, q4_0...",
            llama=("type_k",),
            to_llama=lambda value, _: ggml_type(str(value)),
            label="K cache type",
        ),
        LlamaSetting(
            "type_v",
            "cache_type",
            "f16",
            "V cache type (quantized needs flash_attn=True)",
            llama=("type_v",),
            to_llama=lambda value, _: ggml_type(str(value)),
            label="V cache type",
        ),
        LlamaSetting(
            "gpu_layers",
            "gpu_layers",
            0,
            "layers offloaded to a GPU (-1: all)",
            llama=("n_gpu_layers",),
            stored="n_gpu_layers",
            label="GPU layers",
            newer=False,
            option="layers offloaded to a GPU",
        ),
        LlamaSetting("mmap", "flag", True, "map the model file (llama.cpp use_mmap)", llama=("use_mmap",)),
        LlamaSetting("mlock", "flag", False, "lock the model in RAM (llama.cpp use_mlock)", llama=("use_mlock",)),
        LlamaSetting(
            "offload_kqv",
            "flag",
            True,
            "KV cache and attention on the GPU with the offloaded layers (llama.cpp offload_kqv; "
            "False: llama-bench -nkvo 1)",
            llama=("offload_kqv",),
            label="KV offload",
        ),
        LlamaSetting(
            "sample",
            "flag",
            # False: llama-bench's tg, which feeds seeded tokens; sampling is then timed apart and
            # reported as its own figure.
            False,
            "greedy sampling inside the timed decode loop (False: as llama-bench's tg)",
            not_llama="the engine's timed decode loop samples (True) or feeds seeded tokens (False)",
            label="sampling in decode",
        ),
        LlamaSetting(
            "repack",
            "flag",
            # None (auto) is on, except for quantized weights on a CPU with AMX, whose kernel dies
            # with SIGILL or SIGSEGV (engines/llama_cpp_native.py resolve_repack): the engine resolves it.
            None,
            "llama.cpp weight repacking (use_extra_bufts, llama-bench --repack; default: on, off "
            "for quantized models on AMX CPUs)",
            model_param="use_extra_bufts",
            label="weight repacking",
        ),
    )
}


def llama_arguments(settings: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """The ``llama_cpp.Llama(...)`` keywords and the ``llama_model_params`` fields that every
    setting's value (``settings``, by name, as the engine resolved them) sets."""
    keywords: dict[str, object] = {}
    model_params: dict[str, object] = {}
    for s in LLAMA_SETTINGS.values():
        value = s.llama_value(settings)
        keywords.update(dict.fromkeys(s.llama, value))
        if s.model_param is not None:
            model_params[s.model_param] = value
    return keywords, model_params
