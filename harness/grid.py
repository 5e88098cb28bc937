"""Grids of run configurations: typed values, axis sets, TOML grid files.

A grid is a union of axis sets; each axis set maps `RunConfig` field names
to a value or a list of values and expands to their cartesian product (so
"b63 at cap 63 plus b108 at cap 109" is two axis sets, not a product).
Values arrive as TOML scalars or lists, or as command-line text (``"a,b,c"``,
integer ranges ``"1-6"``); `parse_values` types them as `RunConfig` declares,
and `expand` validates every combination by building its `RunConfig`, so an
impossible value fails with one line before anything runs.

A grid is bounded before it is built: `MAX_GRID_CELLS` cells at most,
counted arithmetically from the axes' value counts (`count_cells`) before
any cell's config exists, and no axis may hold more values than that, so an
integer range such as ``1-300000000`` is refused without being listed. The
limit is far above any study grid (hundreds of cells) and keeps what a sweep
holds per cell bounded: its config, its plan and its entry in ``sweep.json``
(rewritten after every cell), about `PLAN_BYTES_PER_CELL` while planning.
"""

from __future__ import annotations

import itertools
import math
import re
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path

from common.errors import HbenchError
from common.input_files import read_input_text
from common.numbers import MAX_NUMBER_CHARS, parse_float, parse_int
from harness.config import RunConfig

FIELD_TYPES: dict[str, object] = typing.get_type_hints(RunConfig)
Axes = Mapping[str, Sequence]
#: Largest grid file read: a grid is a few lines.
MAX_GRID_BYTES = 4 * 2**20
#: Longest text value of a grid key (a path, a preset name, a label).
MAX_TEXT_CHARS = 4096
#: Most cells one grid may expand to.
MAX_GRID_CELLS = 10_000
#: Memory a sweep holds per planned cell, rounded up from a measurement
#: (tracemalloc peak of expanding 2,000 cells, planning them and building
#: their sweep.json document: 13.2 kB per cell).
PLAN_BYTES_PER_CELL = 16_000


def _too_many(n: int, what: str) -> HbenchError:
    return HbenchError(f"{what} {n:,} cells (planning them would take about "
                       f"{n * PLAN_BYTES_PER_CELL / 2**30:,.1f} GiB); the limit is "
                       f"{MAX_GRID_CELLS:,} cells: split it into smaller sweeps")


# ------------------------------------------------------------------ values

def _base_type(field: str):
    t = FIELD_TYPES[field]
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return (args[0] if args else t), type(None) in typing.get_args(t)


def parse_scalar(field: str, value):
    """One value of ``field`` from TOML or command-line text, typed as RunConfig wants it."""
    if field not in FIELD_TYPES:
        raise HbenchError(f"unknown grid key {field!r}; keys are RunConfig fields "
                          f"({', '.join(f.name for f in fields(RunConfig))})")
    base, optional = _base_type(field)
    if isinstance(value, str):
        text = value.strip()
        if optional and text.lower() in ("none", "null", ""):
            return None
        try:
            if base is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(text)
            if base in (int, float):
                try:
                    return _number(field, base, text)
                except HbenchError:
                    if str in typing.get_args(FIELD_TYPES[field]):
                        return text     # a word the field also takes (utility_alpha: auto)
                    raise
            if len(text) > MAX_TEXT_CHARS:
                raise HbenchError(f"grid key {field}: a value of {len(text):,} characters; "
                                  f"at most {MAX_TEXT_CHARS}")
            return base(text)
        except ValueError:
            raise HbenchError(f"grid key {field}: {value!r} is not a valid {base.__name__}") from None
    if value is None and optional:
        return None
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, base) or (base is int and isinstance(value, bool)):
        raise HbenchError(f"grid key {field}: {value!r} is not a valid {base.__name__}")
    return value


def _number(field: str, base: type, text: str):
    """An int or float grid value, read strictly (`common.numbers`); a float may
    be inf or nan here, for `RunConfig` to refuse under its flag's name."""
    if len(text) > MAX_NUMBER_CHARS:
        raise HbenchError(f"grid key {field}: a number of {len(text):,} characters; "
                          f"at most {MAX_NUMBER_CHARS}")
    try:
        if base is int:
            return parse_int(text, "it")
        return parse_float(text, "it", finite=False)
    except HbenchError as exc:
        raise HbenchError(f"grid key {field}: {text!r} is not a valid {base.__name__} ({exc})") from None


_RANGE = re.compile(r"^\s*([0-9]+)\s*-\s*([0-9]+)\s*$", re.ASCII)


def parse_values(field: str, raw) -> tuple:
    """All values of one axis: a scalar, a list, or text ``"a,b,c"``; integer
    fields also take ranges ``"1-6"`` (inclusive). Duplicates are an error."""
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    out: list = []
    for item in items:
        parts = item.split(",") if isinstance(item, str) else [item]
        for part in parts:
            m = _RANGE.match(part) if isinstance(part, str) else None
            if m and _base_type(field)[0] is int:
                lo, hi = _number(field, int, m.group(1)), _number(field, int, m.group(2))
                if hi < lo:
                    raise HbenchError(f"grid key {field}: empty range {part.strip()!r}")
                if len(out) + hi - lo + 1 > MAX_GRID_CELLS:
                    raise _too_many(len(out) + hi - lo + 1,
                                    f"grid key {field}: {part.strip()!r} alone makes")
                out.extend(range(lo, hi + 1))
            else:
                out.append(parse_scalar(field, part))
                if len(out) > MAX_GRID_CELLS:
                    raise _too_many(len(out), f"grid key {field}: its values alone make at least")
    if not out:
        raise HbenchError(f"grid key {field}: no values")
    if len(set(out)) != len(out):
        raise HbenchError(f"grid key {field}: repeated values in {raw!r}")
    return tuple(out)


def normalize_axes(axes: Mapping) -> dict[str, tuple]:
    return {k: parse_values(k, v) for k, v in axes.items()}


# -------------------------------------------------------------------- grids

def expand(grids: Sequence[Axes], base: Mapping | None = None) -> list[RunConfig]:
    """The configs of a union of axis sets, in order, without duplicates.

    ``base`` holds values shared by every axis set (an axis set overrides it).
    Each combination is validated by `RunConfig`, so an impossible value fails
    with its one-line message before anything runs.
    """
    base_axes = normalize_axes(base or {})
    sets = [{**base_axes, **normalize_axes(axes)} for axes in grids or [{}]]
    n = count_cells(sets)
    if n > MAX_GRID_CELLS:
        raise _too_many(n, "the grid expands to")
    out: dict[str, RunConfig] = {}
    for merged in sets:
        keys = list(merged)
        for combo in itertools.product(*(merged[k] for k in keys)):
            cfg = RunConfig(**dict(zip(keys, combo, strict=True)))
            out.setdefault(cfg.digest(), cfg)
    return list(out.values())


def count_cells(axis_sets: Sequence[Mapping[str, Sequence]]) -> int:
    """Cells of a union of normalized axis sets, counted without building
    them (an upper bound: `expand` drops combinations that repeat a config)."""
    return sum(math.prod(len(v) for v in axes.values()) for axes in axis_sets)


def load_grid_file(path) -> tuple[dict, list[dict]]:
    """(base, axis sets) from a TOML grid file: top-level keys are RunConfig
    fields (a list expands); optional ``[[grid]]`` tables are a union of axis
    sets that each extend the top-level keys."""
    path = Path(path)
    text = read_input_text(path, "--grid", MAX_GRID_BYTES)
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:   # deep nesting recurses in tomllib
        raise HbenchError(f"cannot read grid file {path}: {_first_line(exc)}") from None
    subgrids = doc.pop("grid", [])
    if not isinstance(subgrids, list) or not all(isinstance(g, dict) for g in subgrids):
        raise HbenchError(f"{path}: 'grid' must be an array of tables ([[grid]])")
    for axes in [doc, *subgrids]:
        for k, v in axes.items():
            if isinstance(v, dict):
                raise HbenchError(f"{path}: key {k!r} is a table; grid values are scalars or lists")
            parse_values(k, v)
    return doc, subgrids


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
