"""The two sides of ``--llmperf-against`` as the controller (``session/against.py``) sees them:
each a process (``measuring.worker.Channel`` running ``SIDE_MODULE``) started on first
use and again after it died, with every wait on a deadline and every way it can fail said in one
line that names the side. A side's messages are parsed once, where they come off its channel
(``Side.receive``), into the events below (``SIDE_MODULE``'s docstring lists the messages); in
the side, its session measures through its ``Link`` (the runs: ``measuring.interleave.SideRuns``).
No pytest."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.errors import ConfigError, LLMPerfError
from ..core.formats import escaped
from ..core.workload import Workload
from ..engines.llama_cpp_native import quoted_log, signal_name

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from ..core.measurement import Measurement
    from ..engines import TokenStream
    from ..engines.capabilities import Engine
    from ..judge.result import Outcome
    from ..measuring.interleave import SideRuns
    from ..measuring.worker import Channel
    from .options import MarkerConfig

CURRENT, REF = "current", "REF"
#: What a side's process runs (``python -m``): the pytest layer's side, named, never imported here.
SIDE_MODULE = "pytest_llmperf.pytest_plugin.side"
#: The environment variable that makes a process a side (``SIDE_MODULE``): the JSON of
#: a ``SideEnv``, written by ``Side.spawn`` and read by the side (``SideEnv.read``).
SIDE_ENV = "LLMPERF_SIDE"
#: The least time a side has to reach ``ready`` (a Python start, pytest's collection, imports):
#: --llmperf-engine-timeout bounds a run, not a start.
START_TIMEOUT_S = 120.0
#: The lines of Python's fault handler dump (``python_fault`` says where it was instead).
_DUMP = re.compile(r'(File "|Thread 0x|Current thread 0x|Extension modules: |\.\.\.$)')
_SEPARATOR = re.compile(r"([=!_-])\1{5,}(?: (.*?) \1{5,})?")


@dataclass(frozen=True)
class SideSpec:
    name: str  # CURRENT or REF
    shown: str  # "this tree", "git:main (3f2a1b9c0d1e)"
    python: str
    code_root: str
    packages: tuple[str, ...]


@dataclass(frozen=True)
class SideEnv:
    """What a side process is told at its start: its name, the pytest arguments of the
    controller's session, and where its code under test comes from."""

    name: str
    args: tuple[str, ...]
    code_root: str
    packages: tuple[str, ...]

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> SideEnv | None:
        """This process's side, or None when it is no side."""
        text = environ.get(SIDE_ENV)
        if text is None:
            return None
        d = json.loads(text)
        return cls(d["name"], tuple(d["args"]), d["code_root"], tuple(d["packages"]))


@dataclass(frozen=True)
class Missing:
    """Why a side cannot run a test: ``fails`` when that fails the test (the side did not start,
    its code under test fails to import), else the test is measured on the current side alone."""

    line: str
    fails: bool


class SideGone(LLMPerfError):
    """A side died or stopped answering; ``side`` names it (CURRENT or REF)."""

    def __init__(self, line: str, side: str) -> None:
        super().__init__(line)
        self.side = side


@dataclass(frozen=True)
class SideEvent:
    """One message of a side, parsed (``event_of``); ``ev`` is the word it came with."""

    EV: ClassVar[str] = ""

    @property
    def ev(self) -> object:
        return self.EV

    @classmethod
    def of(cls, message: Mapping[str, object]) -> SideEvent:
        return cls()


def _line(message: Mapping[str, object]) -> str:
    """A side's one line (an exception's text from REF's or this tree's code), escaped: what
    the controller prints of it shows its control characters, never acts on the terminal."""
    return escaped(str(message.get("line")))


@dataclass(frozen=True)
class DataEvent(SideEvent):
    """An event whose whole message is its ``data`` (read by name where it is used)."""

    data: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, message: Mapping[str, object]) -> SideEvent:
        return cls(message)


@dataclass(frozen=True)
class Ready(DataEvent):
    """The side's pytest session collected its tests: ``data`` holds what it collected, its
    collection errors, the tests its code under test breaks, its Python and llama-cpp-python
    versions and where its code comes from (``Side.ready``)."""

    EV = "ready"


@dataclass(frozen=True)
class Measure(DataEvent):
    """The side waits at a measurement: ``data`` holds its label, workload, settings, run cap,
    engine, threads and token-probability abilities (``against.pairs`` reads it)."""

    EV = "measure"


@dataclass(frozen=True)
class Trace(SideEvent):
    """One run's clock readings and counters (``RunTrace.from_json`` reads them)."""

    EV = "trace"
    trace: Any = None

    @classmethod
    def of(cls, message: Mapping[str, object]) -> SideEvent:
        return cls(message.get("trace"))


@dataclass(frozen=True)
class RunError(SideEvent):
    """A run raised (the user's callable, llama.cpp's error): one line."""

    EV = "error"
    line: str = ""

    @classmethod
    def of(cls, message: Mapping[str, object]) -> SideEvent:
        return cls(_line(message))


@dataclass(frozen=True)
class Paused(SideEvent):
    """A stepped run waits between two steps (before its first, after each token) for "go"."""

    EV = "paused"


@dataclass(frozen=True)
class Unstepped(SideEvent):
    """A stepped run showed that its engine cannot pause (``core.errors.NotSteppable``): one line."""

    EV = "unstepped"
    line: str = ""

    @classmethod
    def of(cls, message: Mapping[str, object]) -> SideEvent:
        return cls(_line(message))


@dataclass(frozen=True)
class Logits(SideEvent):
    """The side's token probabilities (``got``), or the one line why it has none."""

    EV = "logits"
    got: Any = None
    line: str | None = None

    @classmethod
    def of(cls, message: Mapping[str, object]) -> SideEvent:
        return cls(message.get("got"), None if "got" in message else _line(message))


@dataclass(frozen=True)
class Attributed(SideEvent):
    """A step of the side's attribution pass done; after its last (``result``) the pass
    (``got``: ``Attribution.to_json()``) and the side's roofline and memory figures; or the one
    line why it has none."""

    EV = "attribution"
    got: Any = None
    figures: Any = None
    line: str | None = None

    @classmethod
    def of(cls, message: Mapping[str, object]) -> SideEvent:
        if "line" in message:
            return cls(line=_line(message))
        return cls(message.get("got"), message.get("figures") or {})


@dataclass(frozen=True)
class Turn(SideEvent):
    """The side asks for an exclusive turn (an A/B ``compare()``, a load test)."""

    EV = "turn"


@dataclass(frozen=True)
class Released(SideEvent):
    """The side's exclusive turn is over."""

    EV = "released"


@dataclass(frozen=True)
class Report(SideEvent):
    """The side ended the test: its serialized reports, pytest's outcome and the first
    failure's line."""

    EV = "report"
    reports: list[dict[str, object]] = field(default_factory=list)
    outcome: str = "passed"  # passed | failed
    line: str | None = None

    @classmethod
    def of(cls, message: Mapping[str, Any]) -> SideEvent:
        line = _line(message) if isinstance(message.get("line"), str) else None
        return cls(list(message.get("reports") or []), str(message.get("outcome")), line)

    @property
    def failed(self) -> bool:
        return self.outcome == "failed"


@dataclass(frozen=True)
class Exit(SideEvent):
    """The side's pytest session ended (a side never ends it by itself)."""

    EV = "exit"
    code: object = "?"

    @classmethod
    def of(cls, message: Mapping[str, object]) -> SideEvent:
        return cls(message.get("code", "?"))


@dataclass(frozen=True)
class Unknown(SideEvent):
    """A message with no ``ev`` this controller knows."""

    said: object = None

    @property
    def ev(self) -> object:
        return self.said


#: Each event by the word it comes with.
EVENTS: dict[str, type[SideEvent]] = {
    e.EV: e
    for e in (Ready, Measure, Trace, RunError, Paused, Unstepped, Logits, Attributed, Turn, Released, Report, Exit)
}


def event_of(message: Mapping[str, object]) -> SideEvent:
    """A side's message as its event (``Unknown`` for a word this controller does not know)."""
    ev = message.get("ev")
    kind = EVENTS.get(ev) if isinstance(ev, str) else None
    return Unknown(ev) if kind is None else kind.of(message)


class Side:
    """One side's process, started on first use (``spawn``, then ``await_ready``) and again
    after it died; a side that failed to start is not started again (``broken``)."""

    def __init__(self, spec: SideSpec, args: Sequence[str], cwd: str, harness: str, timeout_s: float) -> None:
        self.spec, self.args, self.cwd, self.harness, self.timeout_s = spec, list(args), cwd, harness, timeout_s
        self.channel: Channel | None = None
        self.ready: dict[str, Any] = {}
        self.start_error: str | None = None
        self.broken = False  # did not start: every test it was to run fails with start_error
        self.problems: str | None = None  # the redirect's first problem: the side runs, but measures what?
        self.awaiting = False  # started, its ``ready`` not read yet

    @property
    def who(self) -> str:
        return f"side {self.spec.name} ({self.spec.shown})"

    def spawn(self) -> None:
        """Start the process unless it runs (or cannot start); ``await_ready`` waits for it."""
        from ..measuring.worker import Channel  # core.measurement: only a session under --llmperf-against

        if self.broken or (self.channel is not None and self.channel.alive):
            return
        self.close()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([self.harness, *filter(None, [env.get("PYTHONPATH")])])
        env[SIDE_ENV] = SideEnv(self.spec.name, tuple(self.args), self.spec.code_root, self.spec.packages).dumps()
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            env.pop(name, None)  # PYTEST_ADDOPTS stays: the same options on both sides as here
        try:
            self.channel = Channel(SIDE_MODULE, python=self.spec.python, env=env, cwd=self.cwd)
        except OSError as exc:
            self._broke(f"{self.who} cannot start: {exc.strerror or exc}")
            return
        self.awaiting = True

    def await_ready(self, deadline: float) -> None:
        if not self.awaiting:
            return
        self.awaiting = False
        try:
            event = self.receive(max(deadline - time.monotonic(), 0.0), "starting")
        except SideGone as exc:
            self._broke(str(exc))
            return
        if not isinstance(event, Ready):
            self._broke(
                f"{self.who} did not start: its pytest session ended before its first test "
                f"(exit status {event.code if isinstance(event, Exit) else '?'}): {self._cause()}. {self._log()}"
            )
            return
        self.ready = dict(event.data)
        problems = self.ready.get("problems") or []
        self.problems = f"{self.who}: {escaped(str(problems[0]))}" if problems else None

    def _broke(self, line: str) -> None:
        self.start_error, self.broken = line, True
        if self.channel is not None:
            self.channel.kill()
        self.close()

    def send(self, message: Mapping[str, object]) -> None:
        if self.channel is None or not self.channel.send(message):
            raise SideGone(self._died("at work"), self.spec.name)

    def receive(self, timeout_s: float, doing: str) -> SideEvent:
        from ..measuring.worker import BadReply, ChannelClosed

        if self.channel is None:
            raise SideGone(f"{self.who} is gone (while {doing})", self.spec.name)
        try:
            message = self.channel.receive(timeout_s)
        except BadReply as exc:
            raise SideGone(
                f"{self.who} answered with a line that is not a JSON object while {doing}: {exc.text}; it was killed",
                self.spec.name,
            ) from None
        except ChannelClosed:
            raise SideGone(self._died(doing), self.spec.name) from None
        if message is None:
            self.channel.kill()
            raise SideGone(
                f"{self.who} did not answer within {timeout_s:g} s while {doing}; it was killed "
                f"(raise --llmperf-engine-timeout or shorten the workload). {self._log()}",
                self.spec.name,
            )
        return event_of(message)

    def kill(self, line: str) -> SideGone:
        """Kill the process; the SideGone that says why."""
        if self.channel is not None:
            self.channel.kill()
        return SideGone(f"{line}. {self._log()}", self.spec.name)

    def _died(self, doing: str) -> str:
        code = self.channel.wait() if self.channel is not None else None
        where = python_fault(self._text())
        return f"{self.who} died with {signal_name(code)} while {doing}{f' ({where})' if where else ''}. {self._log()}"

    def _text(self) -> str:
        return "" if self.channel is None else self.channel.log_tail(65536)

    def _cause(self) -> str:
        """pytest's words for what stopped it (``ImportError while loading conftest ...: E ...``)."""
        text = self._text()
        head = next((ln.strip() for ln in text.splitlines() if re.match(r"(ImportError|ERROR|INTERNALERROR)", ln)), "")
        errors = [ln.strip()[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
        return (
            escaped("; ".join(filter(None, [head.rstrip("."), errors[-1] if errors else ""]))[:600])
            or "it said nothing"
        )

    def _log(self) -> str:
        kept = []
        for line in self._text().splitlines():
            line = line.strip()
            sep = _SEPARATOR.fullmatch(line)  # pytest's ===== title =====: its title only
            line = (sep.group(2) or "") if sep else line
            if line and not _DUMP.match(line):
                kept.append(line)
        lines = quoted_log("\n".join(kept))
        return f"Its last log lines: {' | '.join(lines[-6:])}" if lines else "It logged nothing"

    def missing(self, nodeid: str) -> Missing | None:
        """Why this side cannot run ``nodeid``, else None."""
        if self.start_error:
            return Missing(self.start_error, fails=True)
        if self.problems:  # the code under test is not the side's own: nothing to compare with
            return Missing(self.problems, fails=False)
        if nodeid in self.ready.get("collected", ()):
            return None
        return self._uncollected(nodeid) or Missing(f"{self.who} has no test {nodeid}", fails=False)

    def _uncollected(self, nodeid: str) -> Missing | None:
        """Why ``nodeid`` did not collect here (its module's import broke, or a collection
        error), if one of the side's broken or erring places covers it."""
        broken: Mapping[str, str] = self.ready.get("broken") or {}
        errors: Mapping[str, str] = self.ready.get("errors") or {}
        for where, line in [*broken.items(), *errors.items()]:
            if where and nodeid != where and not nodeid.startswith((where + "::", where + "/")):
                continue
            if where in broken:
                return Missing(
                    f"{self.who} cannot import {where or nodeid}: its code under test fails there: {escaped(line)}",
                    fails=True,
                )
            return Missing(f"{self.who} cannot collect {where or nodeid}: {escaped(line)}", fails=False)
        return None

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self.awaiting = False


def start_all(sides: Sequence[Side]) -> None:
    """Start the sides that do not run, side by side, each with START_TIMEOUT_S at least."""
    for side in sides:
        side.spawn()
    for side in sides:
        side.await_ready(time.monotonic() + max(side.timeout_s, START_TIMEOUT_S))


def python_fault(text: str) -> str | None:
    """The innermost frame of Python's fault handler dump in a side's log, e.g.
    ``in stream at wrapper/__init__.py:33``; None when there is no dump."""
    at = text.rfind("Fatal Python error:")
    if at < 0:
        return None
    current = text.find("Current thread ", at)  # pytest's fault handler dumps every thread
    frame = re.search(r'^\s*File "([^"]+)", line (\d+) in (\S+)', text[current if current >= 0 else at :], re.MULTILINE)
    if frame is None:
        return None
    path = Path(frame.group(1))
    shown = "/".join(path.parts[-2:]) if len(path.parts) > 1 else str(path)
    return f"in {frame.group(3)} at {shown}:{frame.group(2)}"


def wait_any(sides: Sequence[Side], timeout_s: float) -> list[Side]:
    """The sides with a message waiting (at most ``timeout_s``)."""
    from ..measuring.worker import Channel

    ready = set(map(id, Channel.wait_any([s.channel for s in sides if s.channel is not None], timeout_s)))
    return [s for s in sides if id(s.channel) in ready]


def harness_link(cache_dir: Path) -> Path:
    """A folder holding only ``pytest_llmperf`` (a link to this one): the sides import the plugin
    from the current tree, never another environment's copy, and nothing else of this one. One
    per copy of the plugin under the cache (``harness/<key>``), made once and left for the next
    session: nothing to clean up, so a killed session leaves nothing behind."""
    here = Path(__file__).resolve().parent.parent
    folder = Path(cache_dir) / "harness" / hashlib.sha256(str(here).encode()).hexdigest()[:12]
    link = folder / "pytest_llmperf"
    try:
        if not (link.is_symlink() and os.readlink(link) == str(here)):
            folder.mkdir(parents=True, exist_ok=True)
            made = folder / f".pytest_llmperf.{os.getpid()}"  # made aside, then put in place in one step
            made.unlink(missing_ok=True)
            os.symlink(here, made)
            os.replace(made, link)
    except OSError as exc:
        raise ConfigError(
            f"llmperf: --llmperf-against: cannot link the plugin at {link}: {exc.strerror or exc}"
        ) from None
    return folder


class Link:
    """A side's end of its channel as its session measures through it (``Measurer``): the runs
    the controller asks for (``measuring.interleave.SideRuns``) with the marker's values, and the
    controller's verdict as the judged part of the measurement's ``Outcome``."""

    def __init__(self, runs: SideRuns) -> None:
        self.runs = runs
        self.threads: int | None = None  # the session's llama.cpp threads (None: every usable CPU)

    def turn(self) -> AbstractContextManager[None]:
        """Work no other side may overlap (an A/B ``compare()``, a load test)."""
        return self.runs.turn()

    def measure(
        self, subject: Engine | TokenStream, config: MarkerConfig, label: str, nodeid: str, *, attribution: bool = False
    ) -> tuple[Measurement, Outcome | None]:
        """The measurement the controller drives: the runs it asks for, then its verdict
        (``attribution``: the test asks for the attribution pass after the pairs)."""

        m, verdict = self.runs.measure(
            subject,
            Workload(**config.workload),
            label,
            settings=config.settings,
            max_runs=config.options.get("max_runs"),
            max_processes=config.options.get("max_processes"),
            threads=config.engine.get("threads") or self.threads,
            slo=config.budgets,
            attribution=attribution,
        )
        return m, _assessment(nodeid, label, verdict)


def _assessment(nodeid: str, label: str, verdict: Mapping[str, Any] | None) -> Outcome | None:
    """The controller's verdict as the judged part of the measurement's ``Outcome`` (nothing
    recorded: no baseline)."""
    if verdict is None:
        return None
    from ..judge.attribution import AttributionChange
    from ..judge.parts import PartChange
    from ..judge.result import BaselineVerdict, Outcome, comparison_from_json

    where = verdict.get("attribution")
    v = BaselineVerdict(
        verdict["status"],
        verdict.get("note", ""),
        tuple(comparison_from_json(c) for c in verdict.get("comparisons", ())),
        changes=tuple(str(c) for c in verdict.get("changes", ())),
        parts=tuple(PartChange.from_json(p) for p in verdict.get("parts", ())),
        attribution=None if where is None else AttributionChange.from_json(where),
    ).decided()
    key = nodeid + (f"[{label}]" if label else "")
    return Outcome(key, key=key, verdict=v)
