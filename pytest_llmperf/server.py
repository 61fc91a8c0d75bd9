"""Start and stop llama-cpp-python's OpenAI-compatible server on loopback, without pytest.

Tests (and users) measure a real server this way: ``with serve(model_path) as server:`` starts
``python -m llama_cpp.server`` on a free port of 127.0.0.1, waits until ``/v1/models`` answers,
and stops it on exit (terminate, then kill). A server that does not come up fails with one
line that carries the tail of its stderr.
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

from .errors import EngineError

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
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

    def engine(self, **kwargs: Any) -> Any:
        """An HttpEngine on this server (keyword arguments go to HttpEngine)."""
        from .engines.http import HttpEngine

        kwargs.setdefault("model", self.model)
        return HttpEngine(self.url, **kwargs)


def server_command(
    model_path: str | os.PathLike[str],
    port: int,
    *,
    n_threads: int,
    n_ctx: int = 2048,
    n_batch: int = 512,
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
        return httpx.get(f"{url}/models", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(path: Path, n_chars: int = 300) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[-n_chars:]


@contextlib.contextmanager
def serve(
    model_path: str | os.PathLike[str],
    *,
    n_threads: int | None = None,
    n_ctx: int = 2048,
    n_batch: int = 512,
    alias: str | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> Iterator[Server]:
    """Run llama-cpp-python's server on a free loopback port for the ``with`` block."""
    from .engines.llama_cpp import check_gguf, default_threads

    path = check_gguf(model_path)
    threads = n_threads or default_threads()
    port = free_port()
    url = f"http://{HOST}:{port}/v1"
    with tempfile.TemporaryDirectory(prefix="llmperf-server-") as tmp:
        log = Path(tmp) / "stderr.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                server_command(path, port, n_threads=threads, n_ctx=n_ctx, n_batch=n_batch, alias=alias),
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        try:
            deadline = time.monotonic() + start_timeout_s
            while not _ready(url, 1.0):
                if proc.poll() is not None:
                    tail = _tail(log) or "no output"
                    hint = '; install it: pip install "llama-cpp-python[server]"' if "No module named" in tail else ""
                    raise EngineError(
                        f"llama_cpp.server exited with status {proc.returncode} before it was ready: {tail}{hint}"
                    )
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"llama_cpp.server did not answer {url}/models within {start_timeout_s:.0f} s: "
                        f"{_tail(log) or 'no output'}"
                    )
                time.sleep(0.1)
            yield Server(url=url, model_path=str(path), model=alias or path.stem, n_threads=threads, pid=proc.pid)
        finally:
            stop(proc)


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
