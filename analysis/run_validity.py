"""Which runs a command's tests may use, and what it left out: one rule for
``analyze``, ``reproduce``, ``capacity`` and ``regress``.

A run whose validity verdict failed (`harness.validity`: overload, an arrival
rate it did not get, failures ...) describes a transient or a load it was not
asked for, so by default every command leaves it out of what it tests: a
contrast with such an arm leaves its Holm family, a capacity search does not
count its SLO as met, a regression group does not test its seed. The flag
``--include-invalid`` keeps them. Either way the runs left out (or kept) are
counted and named wherever results are shown, with one sentence built here.
(Imported by the commands for their ``--help``: nothing heavy at import.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

INCLUDE_INVALID_HELP = ("Keep runs that are not valid (overload, off-rate arrivals, failures: "
                        "summary.json's validity) in the tests; by default they are left out, "
                        "counted and named.")
#: Runs named in one sentence before the rest are only counted.
SHOWN = 6


def reasons(summary: Mapping) -> str:
    """The failed checks of a run, comma-separated ("" for a valid run)."""
    v = summary.get("validity")
    return ", ".join(v.get("reasons", [])) if isinstance(v, Mapping) else ""


def keeps(valid: bool, include_invalid: bool) -> bool:
    """Whether a run with verdict ``valid`` enters a command's tests."""
    return bool(valid) or include_invalid


@dataclass(frozen=True)
class RunValidity:
    """How many runs a command read and which of them are not valid
    (``run_id (reasons)`` each), and whether they were kept."""

    total: int
    invalid: tuple[str, ...]
    include_invalid: bool

    def sentence(self, tests: str) -> str:
        """One line for a terminal or a report: the count, the names and
        what happened to them (``tests``: what they were left out of)."""
        if not self.invalid:
            return f"{self.total} runs, all valid."
        names = ", ".join(self.invalid[:SHOWN])
        if len(self.invalid) > SHOWN:
            names += f" and {len(self.invalid) - SHOWN} more"
        fate = (f"kept in {tests} (--include-invalid)" if self.include_invalid
                else f"left out of {tests} (--include-invalid keeps them)")
        return f"{self.total} runs, {len(self.invalid)} not valid, {fate}: {names}."

    def as_dict(self) -> dict:
        return {"runs": self.total, "not_valid": len(self.invalid), "not_valid_runs": list(self.invalid),
                "include_invalid": self.include_invalid}


def of_summaries(items: Iterable[tuple[str, Mapping]], include_invalid: bool) -> RunValidity:
    """`RunValidity` of ``(run_id, summary)`` pairs."""
    from harness.validity import run_is_valid

    items = list(items)
    bad = tuple(f"{rid} ({reasons(s)})" for rid, s in items if not run_is_valid(s))
    return RunValidity(len(items), bad, include_invalid)


def of_runs(runs, include_invalid: bool) -> RunValidity:
    """`RunValidity` of a `analysis.load.load_runs` table (``run_id``,
    ``valid`` and ``validity`` columns)."""
    if runs is None or len(runs) == 0 or "valid" not in runs.columns:
        return RunValidity(0 if runs is None else len(runs), (), include_invalid)
    bad = runs[~runs["valid"].astype(bool)]
    names = tuple(f"{r['run_id']} ({r.get('invalid_reasons', '')})" for _, r in bad.iterrows())
    return RunValidity(len(runs), names, include_invalid)
