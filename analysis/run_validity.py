"""Which runs a command's tests may use, and what it left out: one rule for
``analyze``, ``reproduce``, ``capacity`` and ``regress``.

Validity is per metric (`harness.validity`: a growing queue spoils latency
percentiles, not the throughput the organization sustains). A run whose
verdict for a metric's kind failed describes a transient or a load it was
not asked for, as far as that metric goes, so by default every command
leaves it out of what it tests on that metric: a contrast whose arms are not
valid for its metric leaves its Holm family, a capacity search does not
count an SLO as met on latency that is not valid, a regression group does
not test that metric on its seed. The flag ``--include-invalid`` keeps them.
Either way the runs left out (or kept) are counted per metric kind and named
wherever results are shown, with one sentence built here.
(Imported by the commands for their ``--help``: nothing heavy at import.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

INCLUDE_INVALID_HELP = ("Keep runs that are not valid for a metric (latency under a growing "
                        "queue, off-rate arrivals, failures: summary.json's validity) in that "
                        "metric's tests; by default they are left out, counted and named.")
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
class KindCount:
    """How many of a command's runs are valid for one metric kind, how many
    of those measure under a growing queue, and the checks that spoiled the
    others."""

    kind: str
    valid: int
    growing: int
    checks: tuple[str, ...]


@dataclass(frozen=True)
class RunValidity:
    """How many runs a command read and which of them are not valid for
    every metric (``run_id (reasons)`` each), per metric kind the counts in
    ``kinds``, and whether runs not valid were kept."""

    total: int
    invalid: tuple[str, ...]
    include_invalid: bool
    kinds: tuple[KindCount, ...] = ()

    def sentence(self, tests: str) -> str:
        """One line for a terminal or a report: per metric kind the runs
        valid for it (and as what), the names of the runs not valid for
        every kind and what happened to them (``tests``: what they were left
        out of)."""
        if not self.invalid:
            if self.kinds and any(k.growing for k in self.kinds):
                return f"{self.total} runs; {self._per_kind()}."
            return f"{self.total} runs, all valid."
        names = ", ".join(self.invalid[:SHOWN])
        if len(self.invalid) > SHOWN:
            names += f" and {len(self.invalid) - SHOWN} more"
        fate = (f"kept in {tests} (--include-invalid)" if self.include_invalid
                else f"left out of {tests} on those metrics (--include-invalid keeps them)")
        if not self.kinds:
            return f"{self.total} runs, {len(self.invalid)} not valid, {fate}: {names}."
        return (f"{self.total} runs; {self._per_kind()}. Runs not valid for a metric are {fate}: "
                f"{names}.")

    def _per_kind(self) -> str:
        from harness.validity import CHECK_WORDS, RATE, kind_words

        parts = []
        for k in self.kinds:
            text = f"{kind_words(k.kind)} valid in {k.valid} of {self.total}"
            if k.kind == RATE and k.growing:
                text += (f" ({k.growing} under a growing queue, where throughput is the "
                         "sustained service rate)")
            if k.valid < self.total and k.checks:
                text += " (not: " + ", ".join(CHECK_WORDS.get(c, c) for c in k.checks) + ")"
            parts.append(text)
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {"runs": self.total, "not_valid": len(self.invalid), "not_valid_runs": list(self.invalid),
                "include_invalid": self.include_invalid,
                "valid_by_kind": {k.kind: {"valid": k.valid, "under_growing_queue": k.growing,
                                           "spoiled_by": list(k.checks)} for k in self.kinds}}


def kind_counts(summaries: Iterable[Mapping], metrics: Iterable[str] | None = None) -> tuple[KindCount, ...]:
    """Per metric kind (those of ``metrics``; every kind when None), the
    `KindCount` over the runs' summaries."""
    from harness.validity import metric_verdicts

    summaries = list(summaries)
    out = []
    for kind in _kinds(metrics):
        valid = growing = 0
        checks: list[str] = []
        for s in summaries:
            v = metric_verdicts(s.get("validity"))[kind]
            if v["valid"]:
                valid += 1
                growing += "overload" in reasons(s).split(", ")
            checks += [c for c in v["reasons"] if c not in checks]
        out.append(KindCount(kind, valid, growing, tuple(checks)))
    return tuple(out)


def _kinds(metrics: Iterable[str] | None) -> list[str]:
    from harness.validity import METRIC_KINDS, metric_kind

    wanted = set(METRIC_KINDS) if metrics is None else {metric_kind(m) for m in metrics}
    return [k for k in METRIC_KINDS if k in wanted]


def _not_valid(summary: Mapping, kinds: Iterable[str]) -> bool:
    from harness.validity import metric_verdicts

    verdicts = metric_verdicts(summary.get("validity"))
    return not all(verdicts[k]["valid"] for k in kinds)


def of_summaries(items: Iterable[tuple[str, Mapping]], include_invalid: bool,
                 metrics: Iterable[str] | None = None) -> RunValidity:
    """`RunValidity` of ``(run_id, summary)`` pairs: the runs not valid for
    some kind of ``metrics`` (every kind when None) named, each kind counted."""
    items = list(items)
    kinds = _kinds(metrics)
    bad = tuple(f"{rid} ({reasons(s)})" for rid, s in items if _not_valid(s, kinds))
    return RunValidity(len(items), bad, include_invalid, kind_counts((s for _, s in items), metrics))


def of_runs(runs, include_invalid: bool, metrics: Iterable[str] | None = None) -> RunValidity:
    """`of_summaries` of a `analysis.load.load_runs` table (its ``run_id``
    and ``invalid_reasons`` columns)."""
    if runs is None or len(runs) == 0 or "invalid_reasons" not in runs.columns:
        return RunValidity(0 if runs is None else len(runs), (), include_invalid)
    return of_summaries(((r["run_id"], {"validity": validity_of_reasons(r["invalid_reasons"])})
                         for _, r in runs.iterrows()), include_invalid, metrics)


def validity_of_reasons(failed_checks) -> dict:
    """A validity object from a comma-separated list of failed checks (a
    `load_runs` row's ``invalid_reasons``): enough for
    `harness.validity.metric_verdicts`."""
    from harness.validity import FAIL, verdict

    failed = [c for c in str(failed_checks or "").split(", ") if c]
    return verdict({c: {"status": FAIL, "detail": ""} for c in failed})
