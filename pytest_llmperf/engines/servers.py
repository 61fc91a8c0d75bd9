"""Start and stop a real OpenAI-compatible server on loopback, without pytest.

``with serve_llama_server(model_path, parallel=4) as server:`` starts llama.cpp's own
``llama-server`` (continuous batching over ``parallel`` slots; built from the installed
llama-cpp-python's sources, see engines/native_tools.py) on a free port of 127.0.0.1 and waits
until ``/health`` answers; ``with serve(model_path) as server:`` does the same with the lighter
``python -m llama_cpp.server`` (one request at a time), waiting for ``/v1/models``. Both are
stopped on exit (terminate, then kill; on Linux also when the starting process dies). A server
that does not come up within its deadline fails with one line that carries its stderr's tail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..core.errors import ConfigError, EngineError
from ..core.settings import ENGINE_DEFAULTS, SERVER_N_CTX

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
#: Slots of the ``llmperf_llama_server`` fixture (and ``llmperf load --serve``'s floor).
LLAMA_SERVER_PARALLEL = 4
STOP_TIMEOUT_S = 5.0


def free_port(host: str = HOST) -> int:
    """A port the OS says is free now (a race is possible but rare on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    """A running server: its base URL (``http://127.0.0.1:PORT/v1``) and the model it serves."""

    url: str
    model_path: str
    model: str  # the name the server answers to (``--model_alias``)
    n_threads: int
    pid: int
    kind: str = "llama-cpp-python"  # or "llama-server" (llama.cpp's own, continuous batching)
    parallel: int = 1  # request slots (llama-server --parallel); 1: one request at a time

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: where ``/health`` and ``/metrics`` are."""
        return self.url.rsplit("/v1", 1)[0]

    def engine(self, **kwargs: Any) -> Any:
        """An HttpEngine on this server (keyword arguments go to HttpEngine)."""
        from .http import HttpEngine

        kwargs.setdefault("model", self.model)
        return HttpEngine(self.url, **kwargs)


def server_command(
    model_path: str | os.PathLike[str],
    port: int,
    *,
    n_threads: int,
    n_ctx: int = SERVER_N_CTX,
    n_batch: int = ENGINE_DEFAULTS["n_batch"],
    alias: str | None = None,
) -> list[str]:
    # interrupt_requests off: by default a new request cuts the running stream short, which
    # would turn every concurrent request but the last into an early-ended run.
    return [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model_path),
        "--model_alias", alias or Path(model_path).stem,
        "--host", HOST,
        "--port", str(port),
        "--n_threads", str(n_threads),
        "--n_threads_batch", str(n_threads),
        "--n_ctx", str(n_ctx),
        "--n_batch", str(n_batch),
        "--interrupt_requests", "False",
        "--verbose", "False",
    ]


def _ready(url: str, timeout_s: float) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(path: Path, n_chars: int = 300) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[-n_chars:]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the server gets SIGTERM when the process that started it dies (even by SIGKILL),
    so a killed pytest leaves no server behind."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def _launch(
    command: list[str], ready_url: str, name: str, start_timeout_s: float, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` until the ``with`` block ends; ready when ``ready_url`` answers 200.

    Stopped on every exit (an exception, a failed test, Ctrl-C): SIGTERM, then SIGKILL."""
    with tempfile.TemporaryDirectory(prefix="llmperf-server-") as tmp:
        log = Path(tmp) / "stderr.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        try:
            deadline = time.monotonic() + start_timeout_s
            while not _ready(ready_url, 1.0):
                if proc.poll() is not None:
                    tail = _tail(log) or "no output"
                    hint = '; install it: pip install "llama-cpp-python[server]"' if "No module named" in tail else ""
                    raise EngineError(f"{name} exited with status {proc.returncode} before it was ready: {tail}{hint}")
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"{name} did not answer {ready_url} within {start_timeout_s:.0f} s: {_tail(log) or 'no output'}"
                    )
                time.sleep(0.1)
            yield proc
        finally:
            stop(proc)


@contextlib.contextmanager
def serve(
    model_path: str | os.PathLike[str],
    *,
    n_threads: int | None = None,
    n_ctx: int = SERVER_N_CTX,
    n_batch: int = ENGINE_DEFAULTS["n_batch"],
    alias: str | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> Iterator[Server]:
    """Run llama-cpp-python's server on a free loopback port for the ``with`` block."""
    from .llama_cpp_native import check_gguf, default_threads

    path = check_gguf(model_path)
    threads = n_threads or default_threads()
    port = free_port()
    url = f"http://{HOST}:{port}/v1"
    command = server_command(path, port, n_threads=threads, n_ctx=n_ctx, n_batch=n_batch, alias=alias)
    with _launch(command, f"{url}/models", "llama_cpp.server", start_timeout_s) as proc:
        yield Server(url=url, model_path=str(path), model=alias or path.stem, n_threads=threads, pid=proc.pid)


def llama_server_command(
    binary: str | os.PathLike[str],
    model_path: str | os.PathLike[str],
    port: int,
    *,
    n_threads: int,
    parallel: int,
    n_ctx: int = SERVER_N_CTX,
    n_batch: int = ENGINE_DEFAULTS["n_batch"],
    alias: str | None = None,
) -> list[str]:
    """llama.cpp's server with ``parallel`` slots of ``n_ctx`` tokens each (continuous
    batching is its default) and the Prometheus ``/metrics`` endpoint."""
    return [
        str(binary),
        "--model", str(model_path),
        "--alias", alias or Path(model_path).stem,
        "--host", HOST,
        "--port", str(port),
        "--threads", str(n_threads),
        "--threads-batch", str(n_threads),
        "--ctx-size", str(n_ctx * parallel),
        "--batch-size", str(n_batch),
        "--parallel", str(parallel),
        "--metrics",
        "--no-webui",
    ]


@contextlib.contextmanager
def serve_llama_server(
    model_path: str | os.PathLike[str],
    *,
    parallel: int = 4,
    n_threads: int | None = None,
    n_ctx: int = SERVER_N_CTX,
    n_batch: int = ENGINE_DEFAULTS["n_batch"],
    alias: str | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    build: bool = True,
) -> Iterator[Server]:
    """Run llama.cpp's ``llama-server`` (of the installed llama-cpp-python's version, built
    once: ``llmperf server build``) on a free loopback port for the ``with`` block."""
    from .llama_cpp_native import check_gguf, default_threads
    from .native_tools import tool_path

    if parallel < 1:
        raise ConfigError(f"llama-server needs parallel >= 1 slots, got {parallel}")
    binary = tool_path("llama-server", build=build)
    path = check_gguf(model_path)
    threads = n_threads or default_threads()
    port = free_port()
    url = f"http://{HOST}:{port}/v1"
    command = llama_server_command(
        binary, path, port, n_threads=threads, parallel=parallel, n_ctx=n_ctx, n_batch=n_batch, alias=alias
    )
    with _launch(command, f"http://{HOST}:{port}/health", "llama-server", start_timeout_s) as proc:
        yield Server(
            url=url, model_path=str(path), model=alias or path.stem, n_threads=threads, pid=proc.pid,
            kind="llama-server", parallel=parallel,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)
