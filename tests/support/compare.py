"""Equality of result values as the results files compare them."""

from __future__ import annotations

import math

import numpy as np


def same(a, b, typed: bool = False) -> bool:
    """Equal, with NaN equal to NaN (a missing value on both sides); of one
    type too when ``typed`` (an int column must not come back as floats)."""
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b and (not typed or type(a) is type(b))


def same_bits(a: float, b: float) -> bool:
    """The same float64 bits, NaN equal to NaN and a zero's sign aside (which of
    0.0 and -0.0 sorts first is not fixed)."""
    if np.isnan(a) or np.isnan(b):
        return bool(np.isnan(a) and np.isnan(b))
    if a == 0 and b == 0:
        return True
    return np.float64(a).tobytes() == np.float64(b).tobytes()
