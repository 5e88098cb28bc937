"""Click parameter types for the numbers a flag takes, read by `common.numbers`.

click's own ``INT`` and ``FLOAT`` call Python's ``int()`` / ``float()``, which
read non-ASCII digits (``--seed ８３`` is 83), accept integers thousands of
digits long and ``1e400`` (infinity). `Int` and `Float` refuse all of that
with one ``Error:`` line naming the flag, and take an optional range, so a
command declares ``type=Int(lo=1)`` where it would have used
``click.IntRange(min=1)``.
"""

from __future__ import annotations

from pathlib import Path

import click

from common.errors import HbenchError
from common.numbers import INT64_MAX, parse_float, parse_int


def _flag(param) -> str:
    if param is None:
        return "value"
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return opts[0] if opts else (param.name or "value").upper()


class Int(click.ParamType):
    """An integer flag: ASCII digits, bounded length, within [lo, hi]."""

    name = "integer"

    def __init__(self, lo: int | None = None, hi: int | None = INT64_MAX):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        return parse_int(value, _flag(param), self.lo, self.hi)


class Float(click.ParamType):
    """A float flag: ASCII, bounded length, finite, within the range."""

    name = "float"

    def __init__(self, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False, hi_open: bool = False):
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open

    def convert(self, value, param, ctx):
        return parse_float(value, _flag(param), self.lo, self.hi,
                           lo_open=self.lo_open, hi_open=self.hi_open)


INT = Int()
FLOAT = Float()


class FloatOr(Float):
    """A float flag that also takes one word (``--utility-alpha auto``)."""

    def __init__(self, word: str, lo: float | None = None, hi: float | None = None):
        super().__init__(lo, hi)
        self.word = word
        self.name = f"float|{word}"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().lower() == self.word:
            return self.word
        return super().convert(value, param, ctx)


class PathFlag(click.ParamType):
    """A path flag or argument as a `pathlib.Path`, refusing the empty string:
    ``Path("")`` is ``.``, so ``--out ''`` would otherwise write into the
    current directory."""

    name = "path"

    def convert(self, value, param, ctx):
        if isinstance(value, Path):
            return value
        if not str(value).strip():
            raise HbenchError(f"{_flag(param)} is empty; give a path")
        return Path(value)


PATH = PathFlag()
