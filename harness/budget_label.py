"""A budget's written forms and its canonical label.

One budget is written many ways (``b83``, ``B83``, ``b083``; ``12gib``,
``12 GiB``): each names the same bytes and must make the same run, so the
configuration keeps the canonical label (`budget_label`), the one
`harness.budget.parse_budget_bytes` reports, and a run's id, cell and
directory name never depend on how the user typed it. Bytes need the model's
geometry (`harness.budget`); the label needs only the text, so it lives here,
below the configuration that normalizes it.
"""

from __future__ import annotations

import re
from decimal import Decimal

from common.numbers import MAX_NUMBER_CHARS

UNITS = {
    "b": ("B", 1),
    "kib": ("KiB", 1 << 10), "mib": ("MiB", 1 << 20), "gib": ("GiB", 1 << 30), "tib": ("TiB", 1 << 40),
    "kb": ("KB", 10**3), "mb": ("MB", 10**6), "gb": ("GB", 10**9), "tb": ("TB", 10**12),
}

# ASCII digits only: b\uff18\uff13 must not read as b83 (a different cell id).
B_RE = re.compile(r"b([0-9]+)", re.IGNORECASE | re.ASCII)
P_RE = re.compile(r"([0-9]+)p", re.IGNORECASE | re.ASCII)
SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)", re.IGNORECASE | re.ASCII)


def budget_label(text: str) -> str:
    """The canonical label of a budget's text (``B083`` -> ``b83``, ``12 gib``,
    ``12.0GiB`` and ``012GiB`` -> ``12GiB``, ``1.50GB`` -> ``1.5GB``); text in no budget form, or too long to be one, comes back
    stripped, for `harness.budget.parse_budget_bytes` to refuse."""
    s = str(text).strip()
    if len(s) > MAX_NUMBER_CHARS:      # a typo, not a budget: the parser says so, unread
        return s
    if m := B_RE.fullmatch(s):
        return f"b{int(m.group(1))}"
    if m := P_RE.fullmatch(s):
        return f"{int(m.group(1))}p"
    if (m := SIZE_RE.fullmatch(s)) and m.group(2).lower() in UNITS:
        return f"{_number(m.group(1))}{UNITS[m.group(2).lower()][0]}"
    return s


def _number(digits: str) -> str:
    """A decimal's one spelling: no leading zeros, no trailing fractional zeros."""
    return format(Decimal(digits).normalize(), "f")
