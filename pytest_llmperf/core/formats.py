"""How things are written: stored and displayed numbers, text tables, pytest node ids.

Stored figures have six significant figures (one definition for every JSON writer, so a value
read back compares equal); one renderer draws every plain-text table; a state (``StrEnum``) is
one of a few words, typed, and written as its word.

A node id, taken apart only here, is ``path::Class::name[params]``. The parameter id is free
text and may hold ``::`` itself (``test_a[x::y]``), so only the ``::`` before the first ``[``
after the path separate parts (a name never holds ``[``). A label (``[#2]``, ``llmperf.measure(label=...)``)
is appended like a parameter id and stays with the last part too."""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypeAlias, TypeVar, overload

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T")

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, enum.Enum):
        """Python 3.11's ``enum.StrEnum``: a member is its value (a ``str``) and prints, formats
        and serialises (JSON, JUnit, SQL) as that word, so a typed state writes what the string
        it replaced wrote."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


#: A JSON value as ``json`` reads it, free-form (a document of a fixed shape has its own type).
JSONValue: TypeAlias = "str | int | float | bool | None | list[JSONValue] | dict[str, JSONValue]"


@overload
def sig6(value: float) -> float: ...
@overload
def sig6(value: None) -> None: ...
def sig6(value: float | None) -> float | None:
    """``value`` to six significant figures (None stays None)."""
    return None if value is None else float(f"{value:.6g}")


def stored_fields(section: DataclassInstance, *left_out: str) -> dict[str, object]:
    """A section's fields as a record stores them, in their order (but ``left_out``): a ``float``
    field to six significant figures (``sig6``), a tuple as a list, the rest as they are. The
    section's module writes its annotations as text (``from __future__ import annotations``)."""
    return {
        f.name: sig6(value) if str(f.type).startswith("float") else list(value) if isinstance(value, tuple) else value
        for f in dataclasses.fields(section)
        if f.name not in left_out
        for value in (getattr(section, f.name),)
    }


#: From this magnitude on a figure is written with an exponent (``1.23e+07``), not its digits.
EXPONENT_FROM = 1e7


def finite(value: _T) -> _T | None:
    """A value as JSON holds it: JSON has no NaN or infinity, so such a figure is None (null)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def fmt(value: float) -> str:
    """Three significant figures for small values, no false precision for large ones; a huge
    or non-finite one with an exponent (``1e+308``, ``inf``), never hundreds of digits."""
    if not math.isfinite(value) or abs(value) >= EXPONENT_FROM:
        return f"{value:.3g}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def fmt_or(value: float | None, missing: str = "n/a") -> str:
    """``fmt(value)``, or ``missing`` where there is no value."""
    return missing if value is None else fmt(value)


def cell(value: object, missing: str = "-") -> str:
    """A table cell: ``missing`` for none, a float rounded for display (``fmt``), anything else
    (a word, a count) as it is."""
    if value is None:
        return missing
    return fmt(value) if isinstance(value, float) else str(value)


#: The longest text a message quotes whole.
SHOWN_TEXT_MAX = 32


def shown(value: object) -> str:
    """A value a user gave, as a message writes it: a number readably (``1e+308``, ``inf``,
    ``nan``, ``0.5``, ``12``; never 309 digits), a long text cut (``'1000...' (401 characters)``),
    anything else as its ``repr``."""
    if isinstance(value, str) and len(value) > SHOWN_TEXT_MAX:
        return f"{value[: SHOWN_TEXT_MAX // 2]!r}... ({len(value)} characters)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, int) and abs(value) < 10**15:
        return str(value)
    try:
        return f"{value:.6g}"
    except OverflowError:  # an int too large for a float
        return f"an integer of {len(str(abs(value)))} digits"


#: Characters that would act on a terminal or a reader instead of showing: C0 and C1 controls
#: (ESC starts colour, cursor and title sequences; CR and BS overwrite what came before; a
#: newline splits one line in two), zero-width and bidirectional marks (text shown reversed).
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def escaped(text: str) -> str:
    """Text from another process (a server, REF's pytest, llama.cpp's log, git) as a message
    quotes it: every character in ``_UNSHOWN`` written as its Python escape (``\x1b``,
    ``\n``, ``\u202e``), so what we print is what it sent, inert and on one line."""
    return _UNSHOWN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def render_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """First column left-aligned, the others right-aligned, two spaces apart, a rule under the headers."""
    rows = [list(r) for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        return "  ".join([str(first).ljust(widths[0])] + [str(c).rjust(w) for c, w in zip(rest, widths[1:])])

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def parts(nodeid: str) -> list[str]:
    """``["tests/a.py", "TestX", "test_y[x::y]"]`` of ``tests/a.py::TestX::test_y[x::y]``; an
    id with no ``::`` is one part."""
    head, sep, rest = nodeid.partition("::")
    if not sep:
        return [nodeid]
    names, bracket, params = rest.partition("[")
    pieces = names.split("::")
    pieces[-1] += bracket + params
    return [head, *pieces]


def in_module(nodeid: str) -> str:
    """The id without its module path: ``TestX::test_y[x::y]`` (an id with no ``::``: itself)."""
    found = parts(nodeid)
    return "::".join(found[1:]) if len(found) > 1 else nodeid


def last(nodeid: str) -> str:
    """The innermost part with its parameters: ``test_y[x::y]``."""
    return parts(nodeid)[-1]


def full_id(nodeid: str, module: str) -> str:
    """The id that names a test whatever the rootdir: ``nodeid`` with its module part made
    ``module`` (the module's path relative to the rootdir, ``/``-separated) where pytest's id
    does not name it: a module outside the rootdir given on the command line is ``::test_a``
    or ``test_x.py::test_a``, the same for two folders' ``test_x.py``."""
    found = parts(nodeid)
    if len(found) < 2 or found[0] == module:
        return nodeid
    return f"{module}::{in_module(nodeid)}"
