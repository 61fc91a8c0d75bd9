"""What an engine is, and what it may offer besides: one small protocol per ability.

``Engine`` is ``info`` and ``run``; that is all a measurement needs. Every further ability is
a protocol of its own below, which an engine declares by naming it among its bases::

    class LlamaCppEngine(Engine, LayerTiming, TokenProbabilities, FreshLoads, Closable): ...

and which the measuring code asks for with ``isinstance``, never by probing attributes. The
protocols are ``runtime_checkable``: an engine of a user's that has the members without naming
the protocol counts too, and one with ``info`` and ``run`` alone (``CallableEngine``) has none
of them. ``tests/test_capabilities.py`` checks that every shipped engine declares exactly the
abilities it implements.

(Python 3.10 and 3.11 read a protocol's data members and properties with ``hasattr`` on an
``isinstance`` check: the properties named here are cheap and do not raise on a live engine.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from ..core.workload import EngineInfo, RunTrace, SentRequest, TokenLogits, Workload

if TYPE_CHECKING:
    import httpx
    from llama_cpp import Llama
    from llama_cpp.llama_cpp import llama_context_p, llama_sampler_p

    from .llama_cpp_native import Context, Sampler


@dataclass(frozen=True)
class TimedDecode:
    """The clock reads of one run (``time.perf_counter_ns``).

    ``token_ns[i]``: when output token i was available: token 0 when the prompt's logits were
    ready (fed) or sampled from them (sampling), every later one right after its step (after
    ``llama_synchronize`` when fed, after sampling otherwise). Step i (i >= 1) of decode runs
    from ``token_ns[i - 1]`` to ``token_ns[i]``.
    """

    start_ns: int
    prefill_done_ns: int
    token_ns: tuple[int, ...]
    token_ids: tuple[int, ...]


@runtime_checkable
class Engine(Protocol):
    """Anything that can run one request of a workload and report its clock readings."""

    def info(self) -> EngineInfo: ...

    def run(self, workload: Workload, run_index: int) -> RunTrace: ...


@runtime_checkable
class Closable(Protocol):
    """Holds what must be given back (a model, a worker process, connections): ``close()``
    frees it. The session and the engine pool close such an engine when done with it."""

    def close(self) -> None: ...


class FreshEngine(Engine, Closable, Protocol):
    """What ``FreshLoads.fresh`` returns: an engine that is closed after its one request."""


@runtime_checkable
class FreshLoads(Protocol):
    """Model-load samples (``model_load``, ``max_load_ms``): ``fresh()`` is another engine of the
    same settings with its model loaded now (``EngineInfo.load_ms``)."""

    def fresh(self) -> FreshEngine: ...


@runtime_checkable
class FreshInstances(Protocol):
    """An A/B's second level (``measuring.interleave``, docs/ab.md "Instances: the second
    level"): ``fresh_instance()`` is a new instance of this engine with the same settings (its
    model loaded again, a fresh context: its own placement in memory), which the caller runs,
    warms up and closes; this engine is left as it is. A user's object or callable without it
    runs every pair of an A/B on the one instance it is."""

    def fresh_instance(self) -> FreshEngine: ...


@runtime_checkable
class LayerTiming(Protocol):
    """Per-layer timing in this process (``measuring.layers`` drives it): a second context on
    the engine's model with llama.cpp's eval callback installed, run by the engine's own timed
    loop, so the instrumented runs time what the plain runs time."""

    @property
    def lib(self) -> ModuleType:
        """llama-cpp-python's low-level bindings (``llama_cpp``)."""
        ...

    def make_sampler(self) -> llama_sampler_p: ...

    def prompt_ids(self, workload: Workload) -> list[int]: ...

    def decode_feed(self, workload: Workload) -> list[int] | None: ...

    def instrumented_context(self, cb_eval: object, tokens: int) -> llama_context_p: ...

    def timed_decode(
        self, ctx: Context, prompt_ids: Sequence[int], max_tokens: int, *, feed: Sequence[int] | None, sampler: Sampler
    ) -> TimedDecode: ...


@runtime_checkable
class RemoteLayerTiming(Protocol):
    """Per-layer timing done where the engine's model runs (the engine worker's process):
    ``profile_layers(workload)`` returns the ``measuring.layers.LayerProfile``,
    ``attribution_pass(workload)`` the attribution pass (the same eval callback, asked about every
    node) run by run: a ``measuring.attribution.Stepping``."""

    def profile_layers(self, workload: Workload) -> Any: ...

    def attribution_pass(self, workload: Workload) -> Any: ...


@runtime_checkable
class DrivenLlama(Protocol):
    """Runs of the user's code on a ``llama_cpp.Llama`` (a measured callable): ``driven_llama()``
    is that Llama as an in-process llama.cpp engine (``LayerTiming``, on the Llama's own model and
    settings, the prompt as the code built it) once a run drove one, else None. The attribution
    pass and per-layer timing then time the user's Llama."""

    def driven_llama(self) -> LayerTiming | None: ...


def layer_timing(engine: object) -> object | None:
    """What times this engine's layers and graph nodes: the engine itself (in process, or its
    worker), the Llama a callable drove (``DrivenLlama``), or None."""
    if isinstance(engine, (LayerTiming, RemoteLayerTiming)):
        return engine
    return engine.driven_llama() if isinstance(engine, DrivenLlama) else None


def times_layers(engine: object) -> bool:
    """Whether per-layer timing (``layers=True``), the attribution pass and the roofline can
    measure this engine (``layer_timing``)."""
    return layer_timing(engine) is not None


@runtime_checkable
class SteppedRuns(Protocol):
    """Runs that pause between tokens, so that two engines in two processes can take turns token
    by token (``--llmperf-against``'s pairs): ``run_stepped(workload, run_index, pause)`` is
    ``run`` with ``pause()`` called before the run's first clock read and after each token's;
    the time spent in ``pause`` is taken out of the trace's clock readings, so the trace reads as
    the run would have without the pauses. Only an engine that computes nothing while paused
    has it (llama.cpp in this process: nothing runs between its steps). ``NotSteppable``
    (``core.errors``): this run showed it could not pause."""

    def run_stepped(self, workload: Workload, run_index: int, pause: Callable[[], None]) -> RunTrace: ...


@runtime_checkable
class TokenProbabilities(Protocol):
    """Output agreement (``measuring.agreement``): the greedy continuation of a workload's
    prompt and the next-token log-probabilities at each position (``forced``: teacher-forced
    on those ids; ``prompt_ids``: the prompt as token ids). A string: why it cannot say."""

    def token_logits(
        self, workload: Workload, forced: Sequence[int] | None = None, prompt_ids: Sequence[int] | None = None
    ) -> TokenLogits | str: ...


@runtime_checkable
class NeedsPromptIds(TokenProbabilities, Protocol):
    """Token probabilities of an engine that cannot tokenize (an endpoint): ``token_logits``
    takes the prompt as token ids from the other side of an A/B."""

    needs_prompt_ids: Literal[True]


@runtime_checkable
class ConcurrentRuns(Protocol):
    """``run`` may be called from several threads at once (an HTTP endpoint): load tests with
    ``concurrency`` above 1 or a ``rate`` send overlapping requests."""

    concurrent_safe: Literal[True]


@runtime_checkable
class AsyncRuns(Protocol):
    """``run`` as a coroutine on a client of one event loop: a load test runs every request as
    a task of that loop instead of a thread each."""

    def async_client(self) -> httpx.AsyncClient: ...

    async def arun(self, workload: Workload, run_index: int, client: httpx.AsyncClient) -> RunTrace: ...


@runtime_checkable
class ServerMetrics(Protocol):
    """The server's own counters (llama-server's ``/metrics``) around a load level; None where
    the server has none."""

    def server_metrics(self) -> dict[str, float] | None: ...


@runtime_checkable
class SentRequests(Protocol):
    """The requests the engine sent to its server while ``keep_sent`` is True (the session
    sets it under ``--llmperf-write-trace``), each with when the client began it
    (``time.perf_counter_ns``), taken once (the list is emptied): written as a trace."""

    keep_sent: bool

    def take_sent(self) -> list[SentRequest]: ...


@runtime_checkable
class EngineProcess(Protocol):
    """llama.cpp runs in a process of its own (the engine worker): its ``pid`` (the system
    counters of a measurement are that process's) and whether it is still ``alive`` (the
    engine pool replaces one that died)."""

    @property
    def pid(self) -> int: ...

    @property
    def alive(self) -> bool: ...


@runtime_checkable
class ProcessMemory(Protocol):
    """The peak resident memory of the process the model lives in, read by the engine: reset
    before a measurement (True: the reset took), read after (``measuring.runner.PeakRss``)."""

    def reset_peak_rss(self) -> bool: ...

    def peak_rss(self, was_reset: bool) -> Any: ...


@runtime_checkable
class LlamaObject(Protocol):
    """The ``llama_cpp.Llama`` object of the engine's model, for tests (``llmperf_llm``)."""

    llm: Llama | None


#: Every ability, in the order docs/api.md lists them.
CAPABILITIES: tuple[type, ...] = (
    Closable,
    FreshLoads,
    LayerTiming,
    RemoteLayerTiming,
    TokenProbabilities,
    NeedsPromptIds,
    ConcurrentRuns,
    AsyncRuns,
    ServerMetrics,
    SentRequests,
    EngineProcess,
    ProcessMemory,
    LlamaObject,
    SteppedRuns,
    DrivenLlama,
    FreshInstances,
)
