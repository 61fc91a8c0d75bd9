"""Every kind of value a user gives, once: how a text becomes one and whether a value is one.

A kind has two doors, one rule. ``parse(text)``: a text as an option, the environment, an ini
key or an ``llmperf`` flag gives it (``settings.SETTINGS``). ``check(value)``: a Python value
as a marker key or a keyword of ``llmperf.measure()`` gives it (``session.options.KEYS``);
a text is not taken for a number or a flag there, but a share may be written ``"5%"`` either
way. Both return the value and raise ``ValueError`` with the end of a one-line message
(``must be >= 1, got 0``); the caller puts the place in front (``$LLMPERF_THREADS: ...``,
``llmperf marker key 'threads' ...``, argparse's ``argument --threads: ...``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from .errors import did_you_mean
from .formats import shown
from .workload import MAX_TOKENS, too_many

T = TypeVar("T")

#: The largest number a user may give where a number > 0 is asked for (a budget, a rate, a
#: peak, seconds): beyond it no measurement or deadline means anything (1e12 ms is 31 years,
#: 1e12 t/s or MiB no machine has), and ``inf`` would make a floor that fails every run or a
#: wait without a deadline.
MAX_NUMBER = 1e12
#: The largest count (runs, threads, requests...): llama.cpp and the C libraries take counts as
#: a 32-bit ``int``.
MAX_COUNT = 2**31 - 1
#: The longest wait a user may give (``engine_timeout``...): about 11 days, within what every
#: wait of Python's takes (``threading.TIMEOUT_MAX``; a longer one raises OverflowError).
MAX_SECONDS = 1e6
T_co = TypeVar("T_co", covariant=True)


class Kind(Protocol[T_co]):
    """One kind of value (module docstring)."""

    @property
    def metavar(self) -> str: ...  # how an option's help writes its value: N, true|false

    def parse(self, text: str) -> T_co: ...

    def check(self, value: object) -> T_co: ...


@dataclass(frozen=True)
class Integer:
    """An integer >= ``low`` and at most ``high`` (token counts: ``too_many``)."""

    low: int
    high: int = MAX_COUNT
    #: What ``low`` means when it is more than a bound: gpu_layers' "-1: all layers".
    meaning: str = ""
    metavar: str = "N"

    @property
    def expected(self) -> str:
        return f"an integer >= {self.low}" + (f" ({self.meaning})" if self.meaning else "")

    def parse(self, text: str) -> int:
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise ValueError(f"expected {self.expected}, got {shown(text)}") from None
        return self._bounded(value)

    def check(self, value: object) -> int:
        # Below a floor that means something (gpu_layers=-2) says the whole expectation, as it always has.
        if isinstance(value, bool) or not isinstance(value, int) or self.meaning and value < self.low:
            raise ValueError(f"must be {self.expected}, got {shown(value)}")
        return self._bounded(value)

    def _bounded(self, value: int) -> int:
        if value < self.low:
            raise ValueError(
                f"must be >= {self.low}" + (f" ({self.meaning})" if self.meaning else "") + f", got {shown(value)}"
            )
        if value > self.high:
            raise ValueError(
                too_many(value) if self.high == MAX_TOKENS else f"must be <= {self.high}, got {shown(value)}"
            )
        return value


@dataclass(frozen=True)
class Positive:
    """A number > 0 (``unit``: how a message writes it after the bound, `` seconds``)."""

    unit: str = ""
    metavar: str = "X"
    high: float = MAX_NUMBER

    def parse(self, text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise ValueError(f"expected float, got {shown(text)}") from None
        return self._positive(value)

    def check(self, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be a number, got {shown(value)}")  # noqa: TRY004 - one exception, one line
        return float(self._positive(value))

    def _positive(self, value: float) -> float:
        if not 0 < value <= self.high:  # also rejects nan and inf
            raise ValueError(f"must be > 0{self.unit} and at most {self.high:g}{self.unit}, got {shown(value)}")
        return value


def _float(value: float) -> float | None:
    """``value`` as a float; None for an int too large for one (``10**400``)."""
    try:
        return float(value)
    except OverflowError:
        return None


def _percent(raw: str) -> float | None:
    """``5%`` -> 0.05, ``0.05`` -> 0.05; None for anything else."""
    raw = raw.strip()
    try:
        return float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        return None


def parse_fraction(text: object, *, high: float = 10.0) -> float:
    """A share written ``5%`` or ``0.05`` (the same everywhere a threshold is given).

    Raises ValueError with a one-line message for anything else, or a value outside
    ``(0, high)``."""
    value = None if isinstance(text, bool) else _float(text) if isinstance(text, (int, float)) else _percent(str(text))
    if value is None:
        raise ValueError(f"expected a share like 5% or 0.05, got {shown(text)}")
    if not 0 < value < high:  # also rejects nan
        raise ValueError(f"expected a share between 0 and {high:g} (e.g. 5% or 0.05), got {shown(text)}")
    return value


@dataclass(frozen=True)
class Fraction:
    """A share in (0, ``high``): a threshold (``5%`` or ``0.05``), a significance level (high 1)."""

    high: float = 10.0
    metavar: str = "SHARE"

    def parse(self, text: str) -> float:
        return parse_fraction(text, high=self.high)

    def check(self, value: object) -> float:
        if isinstance(value, (str, int, float)):
            return parse_fraction(value, high=self.high)
        raise ValueError(f"expected a share like 5% or 0.05, got {value!r}")


@dataclass(frozen=True)
class Share:
    """A share of a whole in (0, 1] (``min_goodput``, ``min_mbu``): ``0.95`` or ``95%``, the
    marker's and ``llmperf load --min-goodput``'s alike. Raises ValueError (one line)."""

    metavar: str = "SHARE"

    def parse(self, text: str) -> float:
        return self.check(text)

    def check(self, value: object) -> float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = _float(value)
        elif isinstance(value, str):
            number = _percent(value)
        if number is None or not 0 < number <= 1:  # also rejects nan
            raise ValueError(f"must be a share in (0, 1], e.g. 0.95, got {shown(value)}")
        return number


@dataclass(frozen=True)
class Flag:
    """On or off: a text true/false, 1/0, yes/no, on/off; a Python value True or False."""

    metavar: str = "true|false"

    def parse(self, text: str) -> bool:
        word = str(text).strip().lower()
        if word in ("true", "1", "yes", "on"):
            return True
        if word in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {shown(text)}")

    def check(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"must be True or False, got {value!r}")  # noqa: TRY004 - one exception, one line
        return value


@dataclass(frozen=True)
class Choice:
    """One of ``choices`` (lower case), given in any case."""

    choices: tuple[str, ...]
    metavar: str = "NAME"

    def parse(self, text: str) -> str:
        return self._chosen(str(text).strip().lower(), text)

    def check(self, value: object) -> str:
        return self._chosen(value.lower() if isinstance(value, str) else None, value)

    def _chosen(self, word: str | None, given: object) -> str:
        if word is None or word not in self.choices:
            hint = did_you_mean(given, self.choices) if isinstance(given, str) else ""
            raise ValueError(f"must be one of {', '.join(self.choices)}, got {given!r}{hint}")
        return word


def arg_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse type (pytest options, the CLI): its ValueError is argparse's
    one-line error."""

    def convert(raw: str) -> T:
        try:
            return parse(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


#: Counts (threads, runs, engines): an integer >= 1.
COUNT = Integer(1)
#: llama.cpp token counts (context, batch) and a workload's: llama.cpp keeps them in 32 bits, so
#: a larger value would wrap around (2**32 + 512 measures at 512).
TOKENS = Integer(1, MAX_TOKENS)
#: Offloaded layers: -1 offloads all of them.
GPU_LAYERS = Integer(-1, meaning="-1: all layers")
FLAG = Flag()
#: A budget, a rate, a peak: a number > 0.
POSITIVE = Positive()
SECONDS = Positive(" seconds", "SECONDS", MAX_SECONDS)
#: The smallest change that counts (``threshold``, ``tail_threshold``): ``5%`` or ``0.05``.
THRESHOLD = Fraction()
#: A significance level in (0, 1): ``1%`` or ``0.01``.
LEVEL = Fraction(1.0, "LEVEL")
SHARE = Share()
