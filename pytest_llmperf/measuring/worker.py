"""The engine worker: llama.cpp in a child process (JSON lines over pipes, the Channel both
--llmperf-against sides use too), so a crash, abort, OOM kill or hang fails one test.

The child is ``python -m MODULE FD_IN FD_OUT ARGS...``: it reads one JSON object per line from
FD_IN and writes one per line to FD_OUT; its stdout and stderr go to a temporary log file (so
nothing a native library prints can corrupt a message, and its last words are kept for the
crash line); it runs in a session of its own (Ctrl-C reaches the controller, which ends it, and
``kill`` takes its threads and children with it) and, with ``die_with_parent``, dies with a
controller killed by SIGKILL. Every ``receive`` has a deadline.

``WorkerEngine`` is an Engine (``info``, ``run``, ``close``) whose llama.cpp lives in a child
process, ``python -m pytest_llmperf.measuring.worker``, one per engine setting. The child loads
the model once (``LlamaCppEngine``, the same class and timed loop as in process), then answers
one request at a time, one JSON object per line:

    controller -> worker                                worker -> controller
    {"op": "load", "config": EngineConfig fields}       {"ok": true, "info": EngineInfo fields}
    {"op": "run", "run_index": i, "workload": true}     {"ok": true, "info": EngineInfo fields (the context
     + Workload.to_json()                                in use)} + RunTrace.to_json()
    {"op": "layers", "workload": true} + the workload   {"ok": true, "layers": LayerProfile fields}
    {"op": "attribute", "step": "open", "workload": true} {"ok": true}  (the attribution pass, step by step:
     + the workload                                       one warm-up; close drops it)
    {"op": "attribute", "step": "warm" | "close"}       {"ok": true}
    {"op": "attribute", "step": "run", "index": i}      {"ok": true}
    {"op": "attribute", "step": "result"}               {"ok": true, "attribution": Attribution.to_json()}
    {"op": "rss", "reset": bool}                        {"ok": true, "reset": bool, "peak": [bytes, scope]}
    {"op": "logits", "workload": true,                  {"ok": true, "got": logits_json(TokenLogits):
     "forced": [ids] | null, "prompt_ids": ...}          ids, logits as base64 float32 with their shape}
     + the workload
    {"op": "close"}                                     (exits)
                                                        {"ok": false, "error": "one line",
                                                         "kind": "EngineError" | "ConfigError"}

What crosses the boundary is the workload, the engine settings and one run's clock readings (the
workload and the trace as their own stored forms, ``to_json`` / ``from_json``, each on the line
after its message: "+" above): the clock is read in the worker (``time.perf_counter_ns``,
CLOCK_MONOTONIC, the same clock in every process), so the pipe and the JSON lie outside every
timed region. Each call has a deadline (``timeout_s``); past it, or when the child dies, the
worker is killed and the call raises ``EngineCrash``: the signal, the model, the settings,
llama.cpp's last log lines and, for a known cause, what to do. The child exits when the controller goes away (its request pipe
closes, and Linux's parent-death signal covers a controller killed mid-run)."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..core.errors import ConfigError, EngineError, LLMPerfError
from ..core.measurement import Attribution, LayerProfile, PeakRss, PhaseLayers
from ..core.settings import SETTINGS
from ..core.workload import EngineInfo, RunTrace, TokenLogits, Workload, from_stored
from ..engines.capabilities import (
    Closable,
    Engine,
    EngineProcess,
    FreshInstances,
    FreshLoads,
    ProcessMemory,
    RemoteLayerTiming,
    TokenProbabilities,
)
from ..engines.llama_cpp_native import EngineConfig, known_cause, quoted_log, signal_name
from ..models.gguf import gguf_file_type, model_path

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from ..engines.llama_cpp import LlamaCppEngine
    from .attribution import AttributionPass


class ChannelClosed(Exception):
    """The child closed its end: it exited or died (``Channel.wait`` tells how)."""


class BadReply(ChannelClosed):
    """The child wrote a line that is not a JSON object; it was killed (``text``: the line,
    cut to ``SHOWN_REPLY`` characters, as ``repr`` shows it)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


#: Characters of a bad reply line shown in its one line.
SHOWN_REPLY = 80


class Channel:
    """A child process that answers one JSON object per line over two pipes, its stdout and
    stderr in a temporary log file, in a session of its own (Ctrl-C reaches the controller,
    which ends it; ``kill`` takes its threads and children with it). The engine worker and the
    sides of ``--llmperf-against`` are both one: ``python -m MODULE FD_IN FD_OUT ARGS...``."""

    def __init__(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        # Unlinked from the start (O_TMPFILE or unlinked at once): a controller killed by SIGKILL
        # or SIGTERM leaves no log behind; the log is read through its descriptor.
        self.log = tempfile.TemporaryFile(prefix="llmperf-worker-", suffix=".log")  # noqa: SIM115 - owned
        child_env = dict(os.environ if env is None else env)
        # ggml answers an abort by running gdb on itself: seconds of debugger output, not llama.cpp's words.
        child_env.setdefault("GGML_NO_BACKTRACE", "1")
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        self.buffer = b""
        try:
            self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
                [python or sys.executable, "-m", module, str(req_r), str(resp_w), *args],
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=self.log,
                pass_fds=(req_r, resp_w),
                env=child_env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError:
            for fd in (self._req_w, self._resp_r):
                os.close(fd)
            self.log.close()
            raise
        finally:
            os.close(req_r)  # the child's ends: the child holds its own copies
            os.close(resp_w)

    def fileno(self) -> int:
        return self._resp_r

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def send(self, *messages: Mapping[str, object]) -> bool:
        """One line each; False when the child is gone (its request pipe is closed)."""
        try:
            os.write(self._req_w, "".join(json.dumps(m) + "\n" for m in messages).encode())
        except OSError:
            return False
        return True

    def pending(self) -> bool:
        """A whole message is buffered (``receive`` returns it without waiting)."""
        return b"\n" in self.buffer

    def receive(self, timeout_s: float) -> dict[str, Any] | None:
        """The next message, or None when none came within ``timeout_s``; ChannelClosed when
        the child closed its end first."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._resp_r], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self._resp_r, 1 << 20)
            if not chunk:
                raise ChannelClosed()
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
            message = None
        if not isinstance(message, dict):
            self.kill()
            text = line.decode("utf-8", "replace")
            raise BadReply(repr(text[:SHOWN_REPLY]) + ("..." if len(text) > SHOWN_REPLY else ""))
        return message

    @staticmethod
    def wait_any(channels: Sequence[Channel], timeout_s: float) -> list[Channel]:
        """The channels with a message waiting, after at most ``timeout_s``."""
        ready = [c for c in channels if c.pending()]
        if ready:
            return ready
        readable, _, _ = select.select(channels, [], [], timeout_s)
        return list(readable)

    def wait(self, timeout_s: float = 10.0) -> int | None:
        """The child's exit status once it has exited (killed past ``timeout_s``)."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def kill(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: llama.cpp's threads too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def log_tail(self, size: int = 16384) -> str:
        """The last ``size`` bytes of the child's log ("" once closed)."""
        try:
            fd = self.log.fileno()
            end = os.fstat(fd).st_size
            return os.pread(fd, size, max(0, end - size)).decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def log_lines(self) -> list[str]:
        """llama.cpp's (and the child's) last log lines, quoted (``quoted_log``)."""
        return quoted_log(self.log_tail())

    def close(self, wait_s: float = 5.0) -> None:
        """Ask the child to exit; kill it if it does not within ``wait_s``."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.send({"op": "close"})
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self.kill()
        for fd in (self._req_w, self._resp_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.log.close()
        self.process = None

    def __del__(self) -> None:  # a forgotten child must not be left behind
        with contextlib.suppress(Exception):
            self.close()


def die_with_parent() -> None:
    """Linux: SIGKILL this process when the controller dies (prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


#: Seconds a load or one run may take before the worker counts as hung (``--llmperf-engine-timeout``).
DEFAULT_TIMEOUT_S: float = SETTINGS["engine_timeout"].default
#: Test hook: ``op:SIGNAL`` (``run:SIGSEGV``, ``load:SIGABRT``), ``op:hang`` or ``op:garbage`` (a
#: line that is not JSON on the reply pipe) makes the worker fail that way at that request, to exercise the controller's handling without a real fault;
#: ``op:SIGNAL:TEXT`` only in workers whose model path contains TEXT.
FAULT_ENV = "LLMPERF_WORKER_FAULT"


class EngineCrash(EngineError):
    """The worker died or stopped answering: the engine is gone (``WorkerEngine.alive``)."""


def logits_json(got: TokenLogits) -> dict[str, object]:
    """A ``TokenLogits`` as JSON (an engine worker's or a side's reply): the arrays as base64 of
    little-endian bytes, float32 logits (or a served side's int64 top ids, float64 log-probabilities)."""

    def packed(array: npt.NDArray[np.generic] | None, dtype: str) -> dict[str, object] | None:
        if array is None:
            return None
        return {"b64": base64.b64encode(array.astype(dtype).tobytes()).decode("ascii"), "shape": list(array.shape)}

    return {
        "prompt_ids": list(got.prompt_ids),
        "greedy_ids": list(got.greedy_ids),
        "logits": packed(got.logits, "<f4"),
        "top_ids": packed(got.top_ids, "<i8"),
        "top_logprobs": packed(got.top_logprobs, "<f8"),
    }


def logits_of(data: Mapping[str, Any]) -> TokenLogits:
    """``logits_json`` read back."""
    import numpy as np

    def unpacked(d: Mapping[str, Any] | None, dtype: str) -> Any:
        if d is None:
            return None
        return np.frombuffer(base64.b64decode(d["b64"]), dtype=dtype).reshape(d["shape"])

    return TokenLogits(
        tuple(data["prompt_ids"]),
        tuple(data["greedy_ids"]),
        unpacked(data["logits"], "<f4"),
        unpacked(data.get("top_ids"), "<i8"),
        unpacked(data.get("top_logprobs"), "<f8"),
    )


class WorkerEngine(
    Engine, RemoteLayerTiming, TokenProbabilities, FreshLoads, ProcessMemory, EngineProcess, Closable, FreshInstances
):
    """An engine whose llama.cpp runs in a worker process (module docstring): per-layer timing,
    token probabilities and peak RSS are read in the worker, by ``profile_layers``,
    ``token_logits`` and ``peak_rss`` below."""

    def __init__(
        self, config: EngineConfig, *, name: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, label: str = ""
    ) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.label = label  # which side, for an A/B (part of every error line)
        self._info: EngineInfo | None = None
        self._quantization = gguf_file_type(Path(config.model))  # for the crash line; None if unreadable
        self.channel: Channel | None = None
        try:
            self.channel = Channel("pytest_llmperf.measuring.worker")
        except OSError as exc:
            raise EngineError(
                f"{self._who()}cannot start the engine worker ({sys.executable}): {exc.strerror}"
            ) from None
        try:
            reply = self._call({"op": "load", "config": dataclasses.asdict(config), "name": name}, "loading")
        except BaseException:
            self.close()
            raise
        self._info = EngineInfo(**reply["info"])

    # -- Engine protocol -----------------------------------------------------------------------

    def info(self) -> EngineInfo:
        assert self._info is not None
        return self._info

    def run(self, workload: Workload, run_index: int) -> RunTrace:
        reply = self._call({"op": "run", "run_index": run_index}, "running", workload)
        trace = RunTrace.from_json(self._receive("running"))  # the line after the reply
        self._info = EngineInfo(**reply["info"])  # a context fitted to the workload: its n_ctx and buffers
        return trace

    def fresh(self) -> WorkerEngine:
        """Another worker of the same settings, loaded now (a model-load sample)."""
        return WorkerEngine(self.config, name=self.info().model, timeout_s=self.timeout_s, label=self.label)

    def fresh_instance(self) -> WorkerEngine:
        """Another worker of the same settings (an A/B's next block: a fresh process, ``fresh``)."""
        return self.fresh()

    # Peak RSS of the worker's process, where llama.cpp's memory is (``runner.measure``).
    def reset_peak_rss(self) -> bool:
        return bool(self._call({"op": "rss", "reset": True}, "reading the memory of")["reset"])

    def peak_rss(self, was_reset: bool) -> PeakRss:
        peak = self._call({"op": "rss", "reset": False}, "reading the memory of")["peak"]
        return PeakRss(int(peak[0]), peak[1] if was_reset else "process")

    def token_logits(
        self, workload: Workload, forced: Sequence[int] | None = None, prompt_ids: Sequence[int] | None = None
    ) -> TokenLogits:
        """``LlamaCppEngine.token_logits`` in the worker; the logits cross as float32 bytes."""
        message = {
            "op": "logits",
            "forced": None if forced is None else list(forced),
            "prompt_ids": None if prompt_ids is None else list(prompt_ids),
        }
        return logits_of(self._call(message, "reading token probabilities of", workload)["got"])

    def profile_layers(self, workload: Workload) -> LayerProfile:
        """``measuring.layers.profile_layers`` of this engine, run in the worker."""
        reply = self._call({"op": "layers"}, "timing the layers of", workload)
        return from_stored(LayerProfile, reply["layers"], prefill=PhaseLayers, decode=PhaseLayers)

    def attribution_pass(self, workload: Workload) -> RemotePass:
        """``measuring.attribution.AttributionPass`` of this engine, in the worker, run by run."""
        return RemotePass(self, workload)

    def attribution_step(self, step: str, workload: Workload | None = None, **more: object) -> dict[str, Any]:
        """One step of the worker's attribution pass ("attribute" op: open, warm, run, result, close)."""
        return self._call({"op": "attribute", "step": step, **more}, "timing the nodes of", workload)

    @property
    def alive(self) -> bool:
        return self.channel is not None and self.channel.alive

    @property
    def pid(self) -> int:
        assert self.channel is not None
        return self.channel.pid

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not within a few seconds."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    # -- the boundary ----------------------------------------------------------------------------

    def _who(self) -> str:
        return f"[{self.label}] " if self.label else ""

    def _call(self, message: Mapping[str, object], doing: str, workload: Workload | None = None) -> dict[str, Any]:
        """The worker's reply to ``message`` (and ``workload``'s stored form on the line after it)."""
        channel = self.channel
        if channel is None or not channel.alive:
            raise EngineCrash(f"{self._who()}the engine worker for {self._model()} is gone (it crashed earlier)")
        lines = (message,) if workload is None else ({**message, "workload": True}, workload.to_json())
        if not channel.send(*lines):
            raise self._crash(doing)
        reply = self._receive(doing)
        if not reply.get("ok"):
            kind = ConfigError if reply.get("kind") == "ConfigError" else EngineError
            raise kind(f"{self._who()}{reply['error']}")
        return reply

    def _receive(self, doing: str) -> dict[str, Any]:
        """The worker's next line; EngineCrash when it died, wrote something else than JSON, or
        did not answer within ``timeout_s``."""
        channel = self.channel
        assert channel is not None
        try:
            reply = channel.receive(self.timeout_s)
        except BadReply as exc:
            raise EngineCrash(
                f"{self._who()}the engine worker (pid {channel.pid}) for {self._model()} answered with a line that "
                f"is not a JSON object while {doing}: {exc.text}; it was killed (something in it wrote to its reply "
                "pipe); the other tests go on"
            ) from None
        except ChannelClosed:
            raise self._crash(doing) from None
        if reply is None:
            channel.kill()
            raise EngineCrash(
                f"{self._who()}llama.cpp worker did not answer within {self.timeout_s:g} s while {doing} "
                f"{self._model()} ({self._settings()}); it was killed. {self._log_text(channel.log_lines())}"
                "Raise the engine timeout (--llmperf-engine-timeout; llmperf --engine-timeout; LLMPERF_ENGINE_TIMEOUT) "
                "or shorten the workload"
            )
        return reply

    def _crash(self, doing: str) -> EngineCrash:
        assert self.channel is not None
        code = self.channel.wait()
        log = self.channel.log_lines()
        cause = known_cause(code, log, self.config, self._quantization)
        return EngineCrash(
            f"{self._who()}llama.cpp worker died with {signal_name(code)} while {doing} {self._model()} "
            f"({self._settings()}). {self._log_text(log)}{cause or 'the other tests go on'}"
        )

    def _settings(self) -> str:
        return " ".join(f"{k}={v}" for k, v in dataclasses.asdict(self.config).items() if k != "model")

    def _model(self) -> str:
        quant = f", {self._quantization}" if self._quantization else ""
        return f"model {os.path.basename(self.config.model)}{quant}"

    @staticmethod
    def _log_text(log: Sequence[str]) -> str:
        return f"llama.cpp's last log lines: {' | '.join(log)}; " if log else "llama.cpp logged nothing; "

    def __del__(self) -> None:  # a forgotten engine must not leave a process behind
        with contextlib.suppress(Exception):
            self.close()


def load_worker(config: EngineConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S, label: str = "") -> WorkerEngine:
    """A WorkerEngine for ``config`` (a preset name is written once, here, then cached)."""
    path, name = model_path(config.model)
    return WorkerEngine(
        dataclasses.replace(config, model=str(path)), name=name or path.stem, timeout_s=timeout_s, label=label
    )


def preflight(config: EngineConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Load ``config`` and run two tokens in a throw-away worker: raises EngineCrash (one line)
    where loading or running it in process would end this process."""
    engine = load_worker(config, timeout_s=timeout_s)
    try:
        engine.run(Workload(prompt_tokens=4, max_tokens=2, runs=1, warmup=0), 0)
    finally:
        engine.close()


# -- the worker's side --------------------------------------------------------------------------


def _fault(op: str, model: str, replies: IO[bytes]) -> None:
    at, _, what = os.environ.get(FAULT_ENV, "").partition(":")
    what, _, only = what.partition(":")
    if at != op or only not in model:
        return
    if what == "garbage":  # a line that is not JSON on the reply pipe, then on as usual
        replies.write(b"\x1b[31mggml_debug: " + b"x" * 200 + b"\n")
        replies.flush()
        return
    if what == "hang":
        while True:
            time.sleep(3600)
    os.kill(os.getpid(), getattr(signal, what))


def _given(workload: Workload | None) -> Workload:
    if workload is None:
        raise EngineError("the engine worker was sent a request without its workload")
    return workload


def _run(engine: LlamaCppEngine, message: Mapping[str, Any], workload: Workload | None) -> list[dict[str, object]]:
    trace = engine.run(_given(workload), int(message["run_index"]))
    return [{"ok": True, "info": dataclasses.asdict(engine.info())}, trace.to_json()]


def _rss(engine: LlamaCppEngine, message: Mapping[str, object], workload: Workload | None) -> list[dict[str, object]]:
    from .runner import THIS_PROCESS

    reset = THIS_PROCESS.reset_peak_rss() if message["reset"] else False
    peak = THIS_PROCESS.peak_rss(True)
    return [{"ok": True, "reset": reset, "peak": [peak.bytes, peak.scope]}]


def _logits(engine: LlamaCppEngine, message: Mapping[str, Any], workload: Workload | None) -> list[dict[str, object]]:
    got = engine.token_logits(_given(workload), message.get("forced"), message.get("prompt_ids"))
    return [{"ok": True, "got": logits_json(got)}]


def _layers(engine: LlamaCppEngine, message: Mapping[str, Any], workload: Workload | None) -> list[dict[str, object]]:
    from .layers import profile_layers

    return [{"ok": True, "layers": dataclasses.asdict(profile_layers(engine, _given(workload)))}]


class RemotePass:
    """A worker's attribution pass as ``measuring.attribution.Stepping``: each step one request."""

    def __init__(self, worker: WorkerEngine, workload: Workload) -> None:
        self.worker = worker
        worker.attribution_step("open", workload)
        self.open = True

    def warm_up(self) -> None:
        self.worker.attribution_step("warm")

    def run(self, index: int) -> None:
        self.worker.attribution_step("run", index=index)

    def result(self) -> Attribution:
        self.open = False
        return Attribution.from_json(self.worker.attribution_step("result")["attribution"])

    def close(self) -> None:
        if self.open and self.worker.channel is not None and self.worker.channel.alive:
            self.open = False
            self.worker.attribution_step("close")


#: The worker's attribution pass between its steps (one at a time: the worker runs one engine).
_PASS: list[AttributionPass] = []


def _attribute(
    engine: LlamaCppEngine, message: Mapping[str, Any], workload: Workload | None
) -> list[dict[str, object]]:
    from .attribution import AttributionPass

    step = message["step"]
    if step == "open":
        while _PASS:
            _PASS.pop().close()
        _PASS.append(AttributionPass(engine, _given(workload)))
        return [{"ok": True}]
    if not _PASS:
        raise EngineError(f"attribution step {step!r} without an open pass")
    one = _PASS[-1]
    if step == "warm":
        one.warm_up()
    elif step == "run":
        one.run(int(message["index"]))
    elif step == "result":
        _PASS.pop()
        return [{"ok": True, "attribution": one.result().to_json()}]
    else:
        _PASS.pop().close()
    return [{"ok": True}]


#: The requests a loaded engine answers (``load`` and ``close`` are ``serve``'s own): each
#: takes the engine, the request and the workload sent after it (None: none was), and returns
#: the lines of the reply.
Request = Callable[["LlamaCppEngine", Mapping[str, object], Workload | None], list[dict[str, object]]]
REQUESTS: dict[str, Request] = {"run": _run, "rss": _rss, "logits": _logits, "layers": _layers, "attribute": _attribute}


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """Answer the controller's requests until it says close or goes away."""
    from ..engines.llama_cpp import LlamaCppEngine

    engine: LlamaCppEngine | None = None
    model = ""

    def answer(*lines: Mapping[str, object]) -> None:
        replies.write("".join(json.dumps(line) + "\n" for line in lines).encode())
        replies.flush()

    for line in requests:
        message = json.loads(line)
        stored = requests.readline() if message.get("workload") else None  # the workload's line
        op = message["op"]
        if op == "close":
            break
        if op == "load":
            model = str(message["config"]["model"])
        _fault(op, model, replies)
        try:
            if op == "load":
                config = EngineConfig(**message["config"])
                engine = LlamaCppEngine.from_config(config, name=message.get("name"), verbose=True)
                answer({"ok": True, "info": dataclasses.asdict(engine.info())})
            elif engine is None:
                raise EngineError("the engine worker has no model loaded")
            elif op in REQUESTS:
                workload = None if stored is None else Workload.from_json(json.loads(stored))
                answer(*REQUESTS[op](engine, message, workload))
            else:
                raise EngineError(f"the engine worker does not know the request {op!r}")
        except LLMPerfError as exc:
            answer({"ok": False, "error": str(exc), "kind": type(exc).__name__})
    if engine is not None:
        engine.close()


def main(argv: Sequence[str]) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller decides when this ends
    with os.fdopen(int(argv[0]), "rb") as requests, os.fdopen(int(argv[1]), "wb") as replies:
        serve(requests, replies)


if __name__ == "__main__":
    main(sys.argv[1:])


# -- CPU placement: both sides of an A/B on the same CPUs (session/against.py) --------------


def idlest_cpus(n: int, sample_s: float = 0.2) -> tuple[int, ...] | None:
    """The ``n`` CPUs of this process's affinity mask that were idlest over ``sample_s`` (per-CPU
    busy time from /proc/stat), lowest number first; None when ``n`` covers them all or the
    kernel does not say. Both sides of an A/B run on the same ones: a hypervisor that steals
    from one vCPU, or a process busy on one core, then slows both sides alike, not the side
    whose process the scheduler kept there (seen in CI: an unchanged test 1.42x "slower")."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return None
    if n >= len(allowed):
        return None

    def busy() -> dict[int, int] | None:
        try:
            return busy_ticks(Path("/proc/stat").read_text())
        except OSError:
            return None

    before = busy()
    time.sleep(sample_s)
    after = busy()
    if before is None or after is None:
        return tuple(allowed[-n:])
    return idlest_of(allowed, before, after, n)


def busy_ticks(stat: str) -> dict[int, int]:
    """Busy clock ticks per CPU from the text of /proc/stat: everything but idle and iowait."""
    out = {}
    for line in stat.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            out[int(name[3:])] = sum(ticks) - sum(ticks[3:5])
    return out


def idlest_of(allowed: Sequence[int], before: Mapping[int, int], after: Mapping[int, int], n: int) -> tuple[int, ...]:
    """The ``n`` CPUs of ``allowed`` that were busy least between the two readings (a tie: the
    higher number, away from CPU 0's interrupts), lowest number first."""
    ranked = sorted(allowed, key=lambda c: (after.get(c, 0) - before.get(c, 0), -c))
    return tuple(sorted(ranked[:n]))


def pin(cpus: Sequence[int]) -> None:
    """Every thread of this process (llama.cpp's pool too, once started) on ``cpus``; threads
    started later inherit it from the main thread. No CPUs (off Linux): nothing to do."""
    if not cpus:
        return
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task), cpus)
