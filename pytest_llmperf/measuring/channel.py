"""A child process that answers JSON lines over two pipes: the one mechanism behind the engine
worker (``measuring.worker``) and the sides of ``--llmperf-against`` (``pytest_plugin.side``).

The child is ``python -m MODULE FD_IN FD_OUT ARGS...``: it reads one JSON object per line from
FD_IN and writes one per line to FD_OUT; its stdout and stderr go to a temporary log file (so
nothing a native library prints can corrupt a message, and its last words are kept for the
crash line); it runs in a session of its own (Ctrl-C reaches the controller, which ends it, and
``kill`` takes its threads and children with it) and, with ``die_with_parent``, dies with a
controller killed by SIGKILL. Every ``receive`` has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..engines.llama_cpp_native import quoted_log


class ChannelClosed(Exception):
    """The child closed its end: it exited or died (``Channel.wait`` tells how)."""


class Channel:
    """A child process that answers one JSON object per line over two pipes, its stdout and
    stderr in a temporary log file, in a session of its own (Ctrl-C reaches the controller,
    which ends it; ``kill`` takes its threads and children with it). The engine worker and the
    sides of ``--llmperf-against`` are both one: ``python -m MODULE FD_IN FD_OUT ARGS...``."""

    def __init__(
        self, module: str, args: Sequence[str] = (), *, python: str | None = None,
        env: Mapping[str, str] | None = None, cwd: str | None = None,
    ) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="llmperf-worker-", suffix=".log")  # noqa: SIM115 - owned
        child_env = dict(os.environ if env is None else env)
        # ggml answers an abort by running gdb on itself: seconds of debugger output, not llama.cpp's words.
        child_env.setdefault("GGML_NO_BACKTRACE", "1")
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        self.buffer = b""
        try:
            self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
                [python or sys.executable, "-m", module, str(req_r), str(resp_w), *args],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, pass_fds=(req_r, resp_w),
                env=child_env, cwd=cwd, start_new_session=True,
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

    def send(self, message: Mapping[str, Any]) -> bool:
        """False when the child is gone (its request pipe is closed)."""
        try:
            os.write(self._req_w, (json.dumps(message) + "\n").encode())
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
        message: dict[str, Any] = json.loads(line)
        return message

    @staticmethod
    def wait_any(channels: Sequence["Channel"], timeout_s: float) -> list["Channel"]:
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

    def log_lines(self) -> list[str]:
        """llama.cpp's (and the child's) last log lines, quoted (``quoted_log``)."""
        try:
            with open(self.log.name, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 16384))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return []
        return quoted_log(text)

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
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
