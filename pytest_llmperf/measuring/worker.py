"""llama.cpp in a worker process: a native crash, abort, OOM kill or hang costs one test.

``WorkerEngine`` is an Engine (``info``, ``run``, ``close``) whose llama.cpp lives in a child
process, ``python -m pytest_llmperf.measuring.worker``, one per engine setting. The child loads
the model once (``LlamaCppEngine``, the same class and timed loop as in process), then answers
one request at a time. The protocol is one JSON object per line over two pipes (the child's
stdout and stderr are its log file, so nothing llama.cpp prints can corrupt a message):

    controller -> worker                                worker -> controller
    {"op": "load", "config": EngineConfig fields}       {"ok": true, "info": EngineInfo fields}
    {"op": "run", "workload": Workload fields,          {"ok": true, "trace": RunTrace fields}
     "run_index": i}
    {"op": "layers", "workload": Workload fields}       {"ok": true, "layers": LayerProfile fields}
    {"op": "close"}                                     (exits)
                                                        {"ok": false, "error": "one line",
                                                         "kind": "EngineError" | "ConfigError"}

What crosses the boundary is the workload, the engine settings and one run's clock readings:
the clock is read in the worker (``time.perf_counter_ns``, CLOCK_MONOTONIC, the same clock in
every process), so the pipe and the JSON lie outside every timed region. Each call has a
deadline (``timeout_s``); past it, or when the child dies, the worker is killed and the call
raises ``EngineCrash``: the signal, the model, the settings, llama.cpp's last log lines and,
for a known cause, what to do. The child exits when the controller goes away (its request pipe
closes, and Linux's parent-death signal covers a controller killed mid-run).

``python`` and ``path`` (the interpreter and the import path of the child) let a side of an
A/B comparison run another environment or another revision of the code under test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..core.engine_info import EngineInfo
from ..core.errors import ConfigError, EngineError, LLMPerfError
from ..core.settings_table import SETTINGS
from ..core.trace import NativeCounters, RunTrace
from ..core.workload import Workload
from ..engines.config import EngineConfig
from ..models.facts import gguf_file_type
from ..engines.llama_cpp_native import known_cause, quoted_log, signal_name

#: Seconds a load or one run may take before the worker counts as hung (``--llmperf-engine-timeout``).
DEFAULT_TIMEOUT_S: float = SETTINGS["engine_timeout"].default
#: Test hook: ``op:SIGNAL`` (``run:SIGSEGV``, ``load:SIGABRT``) or ``op:hang`` makes the worker
#: fail that way at that request, to exercise the controller's handling without a real fault;
#: ``op:SIGNAL:TEXT`` only in workers whose model path contains TEXT.
FAULT_ENV = "LLMPERF_WORKER_FAULT"


class EngineCrash(EngineError):
    """The worker died or stopped answering: the engine is gone (``WorkerEngine.alive``)."""


def _tuples(value: Any) -> Any:
    """JSON arrays back to the tuples the frozen results hold."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _of(cls: Any, data: Mapping[str, Any], **nested: Any) -> Any:
    fields = {k: _tuples(v) for k, v in data.items()}
    for name, kind in nested.items():
        if fields.get(name) is not None:
            fields[name] = _of(kind, data[name])
    return cls(**fields)


def trace_of(data: Mapping[str, Any]) -> RunTrace:
    return _of(RunTrace, data, native=NativeCounters)  # type: ignore[no-any-return]


def layers_of(data: Mapping[str, Any]) -> Any:
    from .layers import LayerProfile, PhaseLayers

    return _of(LayerProfile, data, prefill=PhaseLayers, decode=PhaseLayers)


class WorkerEngine:
    """An engine whose llama.cpp runs in a worker process (module docstring)."""

    #: Per-layer timing, run inside the worker (``profile_layers`` below), and the roofline.
    supports_layer_timing = True

    def __init__(
        self,
        config: EngineConfig,
        *,
        name: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        python: str | None = None,
        path: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        label: str = "",
    ) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.label = label  # which side, for an A/B (part of every error line)
        self._info: EngineInfo | None = None
        self._quantization: str | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="llmperf-worker-", suffix=".log")  # noqa: SIM115 - owned
        child_env = dict(os.environ if env is None else env)
        # ggml answers an abort by running gdb on itself: seconds of debugger output, not llama.cpp's words.
        child_env.setdefault("GGML_NO_BACKTRACE", "1")
        if path:
            child_env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [child_env.get("PYTHONPATH")])])
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [python or sys.executable, "-m", "pytest_llmperf.measuring.worker", str(req_r), str(resp_w)],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, pass_fds=(req_r, resp_w),
                env=child_env, start_new_session=True,  # Ctrl-C reaches the controller, which ends the worker
            )
        except OSError as exc:
            for fd in (self._req_w, self._resp_r):
                os.close(fd)
            self._log.close()
            raise EngineError(f"{self._who()}cannot start the engine worker ({python or sys.executable}): {exc.strerror}") from None
        finally:
            os.close(req_r)  # the child's ends: the child holds its own copies
            os.close(resp_w)
        self._buffer = b""
        self._quantization = gguf_file_type(Path(config.model))  # for the crash line; None if unreadable
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
        reply = self._call({"op": "run", "workload": dataclasses.asdict(workload), "run_index": run_index}, "running")
        return trace_of(reply["trace"])

    def profile_layers(self, workload: Workload) -> Any:
        """``measuring.layers.profile_layers`` of this engine, run in the worker."""
        reply = self._call({"op": "layers", "workload": dataclasses.asdict(workload)}, "timing the layers of")
        return layers_of(reply["layers"])

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not within a few seconds."""
        if getattr(self, "process", None) is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                os.write(self._req_w, b'{"op": "close"}\n')
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
        for fd in (self._req_w, self._resp_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()
        self.process = None  # type: ignore[assignment]

    # -- the boundary ----------------------------------------------------------------------------

    def _who(self) -> str:
        return f"[{self.label}] " if self.label else ""

    def _call(self, message: Mapping[str, Any], doing: str) -> dict[str, Any]:
        if self.process is None or self.process.poll() is not None:
            raise EngineCrash(f"{self._who()}the engine worker for {self._model()} is gone (it crashed earlier)")
        try:
            os.write(self._req_w, (json.dumps(message) + "\n").encode())
        except OSError:
            raise self._crash(doing) from None
        deadline = time.monotonic() + self.timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                raise EngineCrash(
                    f"{self._who()}llama.cpp worker did not answer within {self.timeout_s:g} s while {doing} "
                    f"{self._model()} ({self._settings()}); it was killed. {self._log_text()}"
                    "Raise --llmperf-engine-timeout or shorten the workload"
                )
            ready, _, _ = select.select([self._resp_r], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self._resp_r, 1 << 20)
            if not chunk:
                raise self._crash(doing)
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            kind = ConfigError if reply.get("kind") == "ConfigError" else EngineError
            raise kind(f"{self._who()}{reply['error']}")
        return reply

    def _kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: llama.cpp's threads too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def _crash(self, doing: str) -> EngineCrash:
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill()
            code = self.process.returncode
        log = self._log_lines()
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

    def _log_lines(self) -> list[str]:
        try:
            with open(self._log.name, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 16384))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return []
        return quoted_log(text)

    def _log_text(self, log: Sequence[str] | None = None) -> str:
        log = self._log_lines() if log is None else log
        return f"llama.cpp's last log lines: {' | '.join(log)}; " if log else "llama.cpp logged nothing; "

    def __del__(self) -> None:  # a forgotten engine must not leave a process behind
        with contextlib.suppress(Exception):
            self.close()


def load_worker(config: EngineConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S, label: str = "") -> WorkerEngine:
    """A WorkerEngine for ``config`` (a preset name is written once, here, then cached)."""
    from ..models.synthetic import model_path

    path, name = model_path(config.model)
    return WorkerEngine(dataclasses.replace(config, model=str(path)), name=name or path.stem, timeout_s=timeout_s,
                        label=label)


def preflight(config: EngineConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Load ``config`` and run two tokens in a throw-away worker: raises EngineCrash (one line)
    where loading or running it in process would end this process."""
    engine = load_worker(config, timeout_s=timeout_s)
    try:
        engine.run(Workload(prompt_tokens=4, max_tokens=2, runs=1, warmup=0), 0)
    finally:
        engine.close()


# -- the worker's side --------------------------------------------------------------------------


def _fault(op: str, model: str) -> None:
    at, _, what = os.environ.get(FAULT_ENV, "").partition(":")
    what, _, only = what.partition(":")
    if at != op or only not in model:
        return
    if what == "hang":
        while True:
            time.sleep(3600)
    os.kill(os.getpid(), getattr(signal, what))


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the controller dies (prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """Answer the controller's requests until it says close or goes away."""
    from ..engines.llama_cpp import LlamaCppEngine

    engine: LlamaCppEngine | None = None
    model = ""

    def answer(reply: Mapping[str, Any]) -> None:
        replies.write((json.dumps(reply) + "\n").encode())
        replies.flush()

    for line in requests:
        message = json.loads(line)
        op = message["op"]
        if op == "close":
            break
        if op == "load":
            model = str(message["config"]["model"])
        _fault(op, model)
        try:
            if op == "load":
                config = EngineConfig(**message["config"])
                engine = LlamaCppEngine.from_config(config, name=message.get("name"), verbose=True)
                answer({"ok": True, "info": dataclasses.asdict(engine.info())})
            elif engine is None:
                raise EngineError("the engine worker has no model loaded")
            elif op == "run":
                trace = engine.run(Workload(**message["workload"]), int(message["run_index"]))
                answer({"ok": True, "trace": dataclasses.asdict(trace)})
            elif op == "layers":
                from .layers import profile_layers

                profile = profile_layers(engine, Workload(**message["workload"]))
                answer({"ok": True, "layers": dataclasses.asdict(profile)})
            else:
                raise EngineError(f"the engine worker does not know the request {op!r}")
        except LLMPerfError as exc:
            answer({"ok": False, "error": str(exc), "kind": type(exc).__name__})
    if engine is not None:
        engine.close()


def main(argv: Sequence[str]) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller decides when this ends
    with os.fdopen(int(argv[0]), "rb") as requests, os.fdopen(int(argv[1]), "wb") as replies:
        serve(requests, replies)


if __name__ == "__main__":
    main(sys.argv[1:])
