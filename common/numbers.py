"""Numbers typed by a user, read strictly: ASCII, bounded length, finite, in range.

Python's own ``int()`` and ``float()`` are too forgiving for input that names
a result: they read non-ASCII digits (``int("８３") == 83``, so ``b８３`` would
silently become the cell ``b83``), they raise a bare ValueError on integers of
more than 4,300 digits, and ``float("1e400")`` is infinity. Every number that
enters from a flag, a budget label, a grid value or an SLO goes through
`parse_int` / `parse_float` here, which refuse all of that with one
`HbenchError` naming the input and what is allowed.
"""

from __future__ import annotations

import math
import re

from common.errors import HbenchError

#: Longest number text read at all: 19 digits hold every int64, and no value a
#: user means (a seed, a request count, a rate) is longer. The bound is checked
#: before any conversion, so a 5,000-digit string costs nothing.
MAX_NUMBER_CHARS = 40
#: Integers beyond int64 cannot be stored in the results' parquet columns nor
#: seeded into every RNG; they are refused at entry.
INT64_MAX = 2**63 - 1

_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_SPECIAL = {"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan", "+nan", "-nan"}


def _text(value, what: str) -> str:
    text = str(value).strip()
    if not text:
        raise HbenchError(f"{what} is empty; give a number")
    if len(text) > MAX_NUMBER_CHARS:
        raise HbenchError(f"{what}: {text[:20]!r}... is {len(text):,} characters long; "
                          f"a number here has at most {MAX_NUMBER_CHARS}")
    return text


def check_range(value, what: str, lo=None, hi=None, *, lo_open: bool = False,
                hi_open: bool = False):
    """``value`` if it lies in the range [lo, hi] (ends open where asked)."""
    low_bad = lo is not None and (value <= lo if lo_open else value < lo)
    high_bad = hi is not None and (value >= hi if hi_open else value > hi)
    if low_bad or high_bad:
        left = "-inf" if lo is None else lo
        right = "inf" if hi is None else hi
        brackets = ("(" if lo_open or lo is None else "[", ")" if hi_open or hi is None else "]")
        raise HbenchError(f"{what} must be in {brackets[0]}{left}, {right}{brackets[1]}, got {value}")
    return value


def parse_int(value, what: str, lo: int | None = None, hi: int | None = INT64_MAX) -> int:
    """An integer from text: ASCII digits with an optional sign, at most
    `MAX_NUMBER_CHARS` long, within [lo, hi] (hi defaults to int64's maximum)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return check_range(value, what, lo, hi)
    text = _text(value, what)
    if not _INT.fullmatch(text):
        raise HbenchError(f"{what} must be an integer written in ASCII digits, got {text!r}")
    return check_range(int(text), what, lo, hi)


def parse_float(value, what: str, lo: float | None = None, hi: float | None = None, *,
                lo_open: bool = False, hi_open: bool = False, finite: bool = True) -> float:
    """A float from text: ASCII decimal or scientific notation at most
    `MAX_NUMBER_CHARS` long, finite unless ``finite`` is False, within the range."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        text = _text(value, what)
        if text.lower() in _SPECIAL and not finite:
            number = float(text)
        elif not _FLOAT.fullmatch(text):
            kind = "a finite number" if finite else "a number"
            raise HbenchError(f"{what} must be {kind} written in ASCII, got {text!r}")
        else:
            number = float(text)
    if finite and not math.isfinite(number):
        raise HbenchError(f"{what} must be a finite number, got {number}")
    if math.isnan(number):
        return number
    return check_range(number, what, lo, hi, lo_open=lo_open, hi_open=hi_open)


def check_physical(value, what: str, lo: float, hi: float) -> float:
    """A measured physical quantity (a rate, a bandwidth, a byte count): a real
    number, finite, positive, and within [lo, hi] so that a typo of 1e-300 or
    1e308 is refused before any simulation divides by it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HbenchError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise HbenchError(f"{what} must be a finite number, got {value}")
    if value <= 0:
        raise HbenchError(f"{what} must be positive, got {value}")
    if not lo <= value <= hi:
        raise HbenchError(f"{what} must be in [{lo:g}, {hi:g}], got {value:g}")
    return value
