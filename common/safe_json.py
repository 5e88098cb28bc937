"""The one loader for every JSON file a user can hand hbench.

A config.json, a dataset, a lengths file, a cost profile, a results tree's
manifest.json and summary.json all come from outside, so each is read the
same bounded way: a regular file (`common.input_files`), at most
`MAX_JSON_BYTES`, UTF-8, nested at most `MAX_JSON_DEPTH` deep (checked by a
scan of the brackets outside strings *before* parsing, since ``json.loads`` of
200,000 nested brackets dies of RecursionError), and free of the non-standard
constants NaN and Infinity. Anything else is one `HbenchError` naming the file.
"""

from __future__ import annotations

import json
import math
import os
import re

from common.errors import HbenchError
from common.input_files import read_input_text

#: Largest JSON file read (256 MiB): well above any config, profile, manifest
#: or lengths list hbench writes or reads, well below what exhausts memory.
MAX_JSON_BYTES = 256 * 2**20
#: Deepest nesting read: hbench's own files nest 4 deep, Hugging Face configs
#: and chat datasets under 10.
MAX_JSON_DEPTH = 100

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """The deepest bracket nesting of JSON ``text`` (brackets inside strings do
    not count); linear in the text, no recursion."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub('""', text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):   # 1e400 reads as infinity
        raise ValueError(f"{text} is beyond the range of a float")
    return value


def loads_json(text: str, what: str, max_depth: int = MAX_JSON_DEPTH):
    """Parse JSON ``text`` from the source ``what`` (a file name or a flag)."""
    depth = json_depth(text)
    if depth > max_depth:
        raise HbenchError(f"{what}: JSON nested {depth:,} deep; at most {max_depth} is read")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except ValueError as exc:   # JSONDecodeError, and the constants refused above
        raise HbenchError(f"{what} is not valid JSON: {exc}") from None


def load_json(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH):
    """The JSON value in the file ``path``; ``what`` names it in errors
    (e.g. ``"--config"``, ``"cost profile"``), the path is added."""
    text = read_input_text(path, what, max_bytes)
    return loads_json(text, f"{what} {os.fspath(path)}", max_depth)


def load_json_object(path: str | os.PathLike, what: str, **bounds) -> dict:
    """`load_json` of a file that must hold a JSON object."""
    value = load_json(path, what, **bounds)
    if not isinstance(value, dict):
        raise HbenchError(f"{what} {os.fspath(path)} holds a JSON {type(value).__name__}, "
                          "not an object")
    return value
