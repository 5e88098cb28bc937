"""One colour per organization, the same in every figure hbench draws.

A figure with two organizations and a figure with four must not give S2 two
colours, so no figure picks colours by its own series order: each asks
`org_color`. The tie colour is the one winner maps use where no organization
wins.
"""

from __future__ import annotations

ORG_COLORS = {"s0": "#7f7f7f", "s1": "#f28e2b", "s2": "#4e79a7", "d0": "#e15759",
              "u0": "#59a14f", "e0": "#9467bd"}
#: An organization not in ORG_COLORS (a fifth one registered later).
OTHER_COLOR = "#17becf"
#: Cells where no organization wins (equal, or the difference is not significant).
TIE_COLOR = "#d9d9d9"


def org_color(org: str) -> str:
    """The colour of organization ``org`` (case-insensitive)."""
    return ORG_COLORS.get(str(org).lower(), OTHER_COLOR)


def text_color_on(hex_color: str) -> str:
    """Black or white, whichever reads better on ``hex_color`` (WCAG luminance)."""
    rgb = [int(hex_color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return "black" if lum > 0.179 else "white"
