"""What a report may say about one tested comparison, read from its table row.

The one significance rule is `analysis.stats.is_significant`: a Holm-adjusted
p below alpha AND an interval that excludes the null. Every table that
compares arms stores its answer in a ``significant`` column computed by
that function: the contrasts and interactions (`analysis.contrasts`), the
capacity search's goodput comparisons, winner map and crossovers
(`analysis.capacity`), the regression groups (`analysis.regress`). The
sentences, figures and tables of a report read that column through
`status` and never decide a winner on their own, so a sentence cannot name
a winner the table beside it calls a tie.

A row is **not tested** when its table left it out of its Holm family
(``excluded``: arms not valid, `analysis.contrasts.evaluate`) or it has no
test (one seed, values that form no ratio): it is drawn and worded as not
tested, with the table's own reason, never as an estimate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from common import metric_labels

SIGNIFICANT = "significant"
NOT_SIGNIFICANT = "not significant"
NOT_TESTED = "not tested"
#: Holm families are counted over the tested rows; every other verdict is a reason not to test.
TESTED_VERDICTS = (SIGNIFICANT, NOT_SIGNIFICANT)
KEY_WORDS = {"budget": "budget {v}", "rate": "{v} req/s", "headroom": "headroom {v}", "q": "q = {v}",
             "engine": "engine {v}", "paging": "paging {v}", "retention": "retention {v}"}


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def status(row: Mapping) -> str:
    """`SIGNIFICANT`, `NOT_SIGNIFICANT` or `NOT_TESTED`, from the row's own
    ``excluded``, ``verdict`` and ``significant`` columns."""
    if bool(row.get("excluded", False)) or str(row.get("verdict", SIGNIFICANT)) not in TESTED_VERDICTS:
        return NOT_TESTED
    return SIGNIFICANT if bool(row.get("significant", False)) else NOT_SIGNIFICANT


def claims_winner(row: Mapping) -> bool:
    """Whether a report may name a winner (or a difference) for this row."""
    return status(row) == SIGNIFICANT


def short_reason(arms_invalid: str) -> str:
    """``arms_invalid`` in one short phrase: the runs named seed by seed
    (``seed 1: run a, b not valid; seed 2: run c not valid``) become a count
    (``3 runs not valid (seeds 1, 2)``); any other reason is kept, once."""
    seeds, runs, other = [], 0, []
    for part in filter(None, (p.strip() for p in str(arms_invalid or "").split(";"))):
        m = re.fullmatch(r"seed (\S+): runs? (.+) not valid", part)
        if m:
            seeds.append(m.group(1))
            runs += len(m.group(2).split(","))
        else:
            other.append(re.sub(r"^seed \S+: ", "", part))
    out = ([f"{runs} run{'s' if runs != 1 else ''} not valid (seed{'s' if len(seeds) > 1 else ''} "
            f"{', '.join(seeds)})"] if seeds else [])
    return "; ".join(out + list(dict.fromkeys(other)))


def untested_reason(row: Mapping) -> str:
    """Why a row is not tested, in a few words ("" when it is tested)."""
    if status(row) != NOT_TESTED:
        return ""
    why = short_reason(row.get("arms_invalid") or "")
    verdict = str(row.get("verdict", ""))
    if bool(row.get("excluded", False)) or verdict == "arms not valid":
        return "arms not valid" + (f": {why}" if why else "")
    if verdict == "too few seeds":
        return "one paired seed, no interval"
    if verdict == "invalid values":
        return "values form no ratio" + (f" ({row['invalid']})" if row.get("invalid") else "")
    return verdict or "no test"


def org_of(side) -> str | None:
    """``ORG`` of an arm filter such as ``budget=b83, org=d0`` (None without one)."""
    m = re.search(r"(?:^|, )org=([^,]+)", str(side or ""))
    return m.group(1).upper() if m else None


def sides(row: Mapping) -> tuple[str, str]:
    """The two organizations (or arms) of a contrast row: numerator, denominator."""
    name = str(row["name"])
    a = org_of(row.get("numerator")) or name.split("/")[0].upper()
    b = org_of(row.get("denominator")) or name.split("/")[-1].split(" ")[0].upper()
    return a, b


def where(name: str) -> str:
    """``d0/s0 @ budget=b83, rate=2.0 [m]`` -> ``at budget b83, 2 req/s``;
    ``d0/s0`` (one design cell) -> ""; a contrast named by a design keeps
    its own name."""
    if re.fullmatch(r"[^/ @]+/[^/ @]+( \[[^\]]*\])?", name):
        return ""                     # an automatic contrast of a single design cell: no place to name
    if " @ " not in name:
        return f"in \u201c{name}\u201d"
    parts = []
    for item in re.sub(r" \[[^\]]*\]$", "", name.split(" @ ", 1)[1]).split(", "):
        key, _, value = item.partition("=")
        v = value
        try:
            v = f"{float(value):g}"
        except ValueError:
            pass
        parts.append(KEY_WORDS.get(key, key + " {v}").format(v=v))
    return "at " + ", ".join(parts)


def title(row: Mapping, with_metric: bool = True) -> str:
    """A contrast row as a short title: an automatic contrast as ``D0/S2
    budget b83, 2 req/s (TTFT p99)``; a design's contrast by its family and
    own name (``Q4: D0/S2 b63``)."""
    name, family = str(row["name"]), str(row.get("family") or "")
    if " @ " not in name and not re.fullmatch(r"[^/ @]+/[^/ @]+( \[[^\]]*\])?", name):
        return f"{family}: {name}" if family and family not in metric_labels.METRICS else name
    a, b = sides(row)
    place = where(name)
    text = f"{a}/{b} {place[3:] if place.startswith('at ') else place}".strip()
    return text + (f" ({metric_labels.name(str(row['metric']))})" if with_metric else "")
