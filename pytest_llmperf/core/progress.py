"""What a long wait says while it lasts (docs/report.md, "While it runs"): one line updated in
place on a terminal, a plain line per step when the output is piped, and a line at least every
``LINE_EVERY_S`` while one step waits; a task quicker than ``QUIET_S`` says nothing.

A task opened inside another on the same thread is a part of it, shown on its line ("against
REF: tests/t.py::test_a: attribution pass: instrumented runs 3 of 8"); another thread's task
meanwhile is silent. Where the lines go is the front end's choice, made once per process
(``set_sink``: the plugin's terminal, the CLI's ``StreamSink``; none: silent). The tests call
``beat`` themselves with their own clock."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Protocol

#: A task over within this many seconds shows nothing (a quick step is no wait).
QUIET_S = 2.0
#: Piped: the longest silence while a task waits (the heartbeat repeats its line).
LINE_EVERY_S = 5.0
#: On a terminal: the line is redrawn at most this often (and at least this often while it waits).
REFRESH_S = 1.0
#: The heartbeat thread sleeps until the task's deadline, but at least this long (it wakes
#: once a second on a terminal, once per ``LINE_EVERY_S`` piped: nothing a measurement feels).
TICK_S = 0.2


class Sink(Protocol):
    """Where a task's lines go. ``live``: a terminal, one line redrawn in place; else plain
    lines, one per call."""

    @property
    def live(self) -> bool: ...

    def show(self, text: str) -> None:
        """The task's line: redrawn in place (live), or written as one more line."""

    def end(self, text: str) -> None:
        """The task is over: its last line (live: it replaces the line in place and ends it)."""


class StreamSink:
    """A text stream (the CLI's stderr): on a TTY the line is redrawn with a carriage return
    and erased at the end (what the command prints next takes its place); else plain lines."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.live = bool(getattr(stream, "isatty", lambda: False)())

    def show(self, text: str) -> None:
        if self.live:
            self.stream.write(f"\r\x1b[K{fit(text, shutil.get_terminal_size().columns - 1)}")
        else:
            self.stream.write(f"{text}\n")
        self.stream.flush()

    def end(self, text: str) -> None:
        self.stream.write("\r\x1b[K" if self.live else f"{text}\n")
        self.stream.flush()


def fit(text: str, width: int) -> str:
    """``text`` within ``width`` columns, its middle left out (a redrawn line that wraps is
    redrawn below itself): the task's name and the step's seconds stay."""
    if len(text) <= width or width < 20:
        return text
    head = width // 3
    return f"{text[:head]}...{text[len(text) - (width - head - 3) :]}"


_sink: Sink | None = None
_here = threading.local()  # .current: this thread's innermost task running
_showing: list[Progress] = []  # the task on the sink's line: one at a time, whichever thread
_showing_lock = threading.Lock()


def set_sink(sink: Sink | None) -> Sink | None:
    """Where the tasks of this process show their lines from now on (None: nowhere); the one before."""
    global _sink
    before, _sink = _sink, sink
    return before


class Progress:
    """One task's state and when its next line is due. ``step(name, done, total)`` starts a step
    (piped: one line); ``advance(done)`` counts within it (a terminal's line only); ``beat()``
    shows the line again once its deadline passed (the heartbeat); ``close()`` ends it. A part
    (``parent``) shows on its parent's line and leaves the deadline to it."""

    def __init__(
        self,
        what: str,
        sink: Sink | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        parent: Progress | None = None,
    ) -> None:
        self.what, self.sink, self.clock, self.parent = what, sink, clock, parent
        self.started = clock()
        self.name, self.done = "", 0
        self.total: int | None = None
        self.child: Progress | None = None
        self.shown = False  # a line was written: the task's end is said too
        self.deadline = self.started + QUIET_S
        self.lock = threading.Lock()

    @property
    def root(self) -> Progress:
        return self if self.parent is None else self.parent.root

    def describe(self) -> str:
        """This task's words and its running part's: "attribution pass: run 3 of 8"."""
        if self.child is not None:  # the part that runs says more than the step it runs in
            return f"{self.what}: {self.child.describe()}"
        step = f"{self.name} {self.done} of {self.total}" if self.total else self.name
        return f"{self.what}: {step}" if step else self.what

    def text(self) -> str:
        root = self.root
        return f"llmperf: {root.describe()} [{root.clock() - root.started:.0f} s]"

    def step(self, name: str, done: int = 0, total: int | None = None) -> None:
        """A new step: piped, its line now (once the task has run ``QUIET_S``); on a terminal, when due."""
        self.name, self.done, self.total = name, done, total
        self.root.due(force=True)

    def advance(self, done: int) -> None:
        """``done`` of the step's total: a terminal's line when due; piped, the heartbeat's next line."""
        self.done = done
        self.root.due(force=False)

    def beat(self) -> None:
        """The line again once the deadline passed (the heartbeat calls this); held while a
        timed region of this process runs (``timed``), unless it has lasted ``TIMED_HOLD_S``."""
        since = _timed_since
        if since is not None and time.monotonic() - since < TIMED_HOLD_S:
            return
        self.root.due(force=False)

    def due(self, *, force: bool) -> None:
        sink = self.sink
        if sink is None:
            return
        with self.lock:
            now = self.clock()
            if now < self.started + QUIET_S:
                return
            if now >= self.deadline or (force and not sink.live):
                sink.show(self.text())
                self.shown = True
                self.deadline = now + (REFRESH_S if sink.live else LINE_EVERY_S)

    def close(self, outcome: str = "done") -> None:
        """The task is over: a shown task says how it ended ("done", "stopped") and its seconds."""
        if self.parent is not None:
            self.parent.child = None
            return
        if self.sink is not None and self.shown:
            with self.lock:
                self.sink.end(f"llmperf: {self.what}: {outcome} in {self.clock() - self.started:.0f} s")


@contextmanager
def task(what: str, *, clock: Callable[[], float] = time.monotonic) -> Iterator[Progress]:
    """One task on the process's sink (``set_sink``): a part of the task that runs, if one does;
    else a task of its own, with a heartbeat thread while it lasts. Silent with no sink."""
    parent: Progress | None = getattr(_here, "current", None)
    with _showing_lock:
        # A task of another thread while one is shown (a test's own threads): silent, not a second line.
        one = Progress(what, None if parent is not None or _showing else _sink, clock=clock, parent=parent)
        if one.sink is not None:
            _showing.append(one)
    if parent is not None:
        parent.child = one
    _here.current = one
    stop = threading.Event()
    beating = None
    if one.sink is not None:
        beating = threading.Thread(target=_heartbeat, args=(one, stop), name="llmperf-progress", daemon=True)
        beating.start()
    outcome = "stopped"
    try:
        yield one
        outcome = "done"
    finally:
        stop.set()
        if beating is not None:
            beating.join()
            with _showing_lock:
                _showing.remove(one)
        _here.current = parent
        one.close(outcome)


#: A timed region longer than this (a single run of an in-process engine) gets the heartbeat's
#: line all the same: the promise of a line at least every 10 s wins over a quiet clock.
TIMED_HOLD_S = 8.0
#: When the timed region that runs in this process began (``timed``), else None.
_timed_since: float | None = None


@contextmanager
def timed() -> Iterator[None]:
    """A timed region of this process (a run whose clock reads are ours: an in-process engine,
    an HTTP client's stamps): the heartbeat thread holds its line until it ends, so no write to
    the terminal lands between two clock reads; the next ``advance`` or beat says it."""
    global _timed_since
    _timed_since = time.monotonic()
    try:
        yield
    finally:
        _timed_since = None


def _heartbeat(one: Progress, stop: threading.Event) -> None:
    while not stop.wait(max(one.deadline - one.clock(), TICK_S)):
        one.beat()


def current() -> Progress:
    """The innermost task running (its steps show on its line), or a silent one."""
    running: Progress | None = getattr(_here, "current", None)
    return running if running is not None else Progress("")
