"""Declared comparisons between arms of a design, evaluated with Holm
correction per family.

A `Contrast` names a metric and two arms, each a filter on the run table
(``{"org": "s1", "q": 1.0}``). `evaluate` pairs the arms by seed and reports
the paired-ratio statistics of `analysis.stats`. Pairing is strict: a seed
must appear at most once per arm, and two runs paired on a seed must have
served the same request stream (equal ``workload_hash``) -- otherwise the
contrast is refused with `HbenchError`, never silently computed. A design
that changes the workload on purpose (q = 0 vs q = 1) is compared through an
`Interaction`: a contrast of two within-workload contrasts.

`auto_contrasts` is what ``hbench analyze DIR`` uses without a design file:
runs are grouped by every configuration field except ``org`` and ``seed``
(and the connection/diagnostic fields in `VOLATILE_KEYS`), and within each
group every pair of organizations is compared (the later one in the
registry's order over the earlier: S1/S0, S2/S0, D0/S2, ...), or, given a
reference organization, every other one over it. The metrics are throughput
and the latency a user waits for (`DEFAULT_METRICS`), because which one
tells the organizations apart depends on the load: under a growing queue
throughput is the service rate each sustains, in a steady state it only
echoes the offered load and latency is the difference. Each metric is one
Holm family.
"""

from __future__ import annotations

import math
import tomllib
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import stats
from analysis.default_metrics import DEFAULT_METRICS, THROUGHPUT
from analysis.load import config_keys, valid_column
from common.errors import HbenchError
from common.input_files import read_input_text
from harness.config import ORG_NAMES
from harness.results import CHECKED_METADATA, metadata_conflict
from harness.validity import CHECK_WORDS, arm_parity, kind_words, metric_kind, spoiling_checks

# Config fields that say how a run was connected or checked, not what was measured.
VOLATILE_KEYS = ("endpoint", "launch", "server_cmd", "debug_invariants")
DEFAULT_METRIC = THROUGHPUT
ALPHA = 0.05
#: Largest design file read: a design is a few dozen lines.
MAX_DESIGN_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Contrast:
    """``metric`` of the numerator arm over the denominator arm, paired by seed."""

    name: str
    metric: str
    numerator: Mapping = field(default_factory=dict)
    denominator: Mapping = field(default_factory=dict)
    family: str = "default"


@dataclass(frozen=True)
class Interaction:
    """A contrast of contrasts ``a`` and ``b`` (named `Contrast`s).

    kind "difference": ``100 (r_a - r_b)`` percentage points, e.g. (S1/S0 at
    q=1) - (S1/S0 at q=0). kind "ratio": ``r_a / r_b``, e.g. K_ret =
    (retention effect under SHARE) / (retention effect under ISOLATE).
    """

    name: str
    a: str
    b: str
    kind: str = "difference"
    family: str = "interactions"

    def __post_init__(self):
        if self.kind not in ("difference", "ratio"):
            raise HbenchError(f"interaction {self.name!r}: kind must be 'difference' or 'ratio', got {self.kind!r}")


def _is_missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _matches(column: pd.Series, value) -> pd.Series:
    if _is_missing(value):
        return column.isna()
    if isinstance(value, bool):
        return column.map(lambda v: not _is_missing(v) and bool(v) == value)
    if isinstance(value, (int, float)):
        num = pd.to_numeric(column, errors="coerce")
        return pd.Series(np.isclose(num.to_numpy(dtype=float), float(value)), index=column.index)
    return column.astype(str) == str(value)


def select(runs: pd.DataFrame, where: Mapping) -> pd.DataFrame:
    """Rows of ``runs`` whose columns equal every value in ``where``."""
    mask = pd.Series(True, index=runs.index)
    for key, value in where.items():
        if key not in runs.columns:
            raise HbenchError(f"unknown column {key!r} in a contrast filter")
        mask &= _matches(runs[key], value)
    return runs[mask]


def describe(where: Mapping) -> str:
    return ", ".join(f"{k}={v}" for k, v in where.items()) or "(all runs)"


def _arm(runs: pd.DataFrame, where: Mapping, contrast: Contrast, side: str) -> pd.DataFrame:
    arm = select(runs, where)
    if arm.empty:
        raise HbenchError(f"contrast {contrast.name!r}: {side} ({describe(where)}) matches no runs")
    dup = arm["seed"][arm["seed"].duplicated()]
    if not dup.empty:
        raise HbenchError(
            f"contrast {contrast.name!r}: {side} ({describe(where)}) has several runs for seed "
            f"{dup.iloc[0]}; narrow the filter so each seed is one run"
        )
    if contrast.metric not in arm.columns:
        raise HbenchError(f"contrast {contrast.name!r}: unknown metric {contrast.metric!r}")
    return arm.set_index("seed")


def pair(runs: pd.DataFrame, contrast: Contrast) -> pd.DataFrame:
    """The seed-paired table of one contrast: index seed, columns num, den,
    num_run, den_run, workload_hash; ``attrs["unpaired"]`` lists the seeds
    only one arm ran. Refuses pairs whose checked metadata disagree (request
    stream, engine and its version, results schema: `metadata_conflict`)."""
    num = _arm(runs, contrast.numerator, contrast, "numerator")
    den = _arm(runs, contrast.denominator, contrast, "denominator")
    seeds = sorted(set(num.index) & set(den.index))
    if not seeds:
        raise HbenchError(f"contrast {contrast.name!r}: the two arms share no seed")
    checked = [k for k in CHECKED_METADATA if k in runs.columns]
    rows = {}
    for s in seeds:
        conflict = metadata_conflict(_meta(num.loc[s], checked), _meta(den.loc[s], checked), checked)
        if conflict:
            raise HbenchError(
                f"contrast {contrast.name!r}: refusing to pair {num.at[s, 'run_id']} with "
                f"{den.at[s, 'run_id']} at seed {s}: {conflict}; the same seed must mean the same "
                "request stream on the same engine"
            )
        rows[s] = {
            "num": num.at[s, contrast.metric], "den": den.at[s, contrast.metric],
            "num_run": num.at[s, "run_id"], "den_run": den.at[s, "run_id"],
            "workload_hash": num.at[s, "workload_hash"],
        }
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "seed"
    out.attrs["unpaired"] = sorted(set(num.index) ^ set(den.index))
    return out


def _meta(row: pd.Series, keys) -> dict:
    return {k: (None if _is_missing(row[k]) else row[k]) for k in keys}


def contrast_ratios(runs: pd.DataFrame, contrast: Contrast) -> dict[int, float]:
    """Within-seed ratios of one contrast, keyed by seed."""
    p = pair(runs, contrast)
    num, den = p["num"].to_dict(), p["den"].to_dict()
    invalid = stats.invalid_pairs(num, den)
    if invalid:
        s, why = next(iter(invalid.items()))
        raise HbenchError(f"contrast {contrast.name!r}: seed {s} forms no ratio ({why})")
    return stats.paired_ratios(num, den)


def _rng(seed: int, name: str) -> np.random.Generator:
    # One stream per contrast name, so a result does not depend on list order.
    return stats.bootstrap_rng(seed, zlib.crc32(name.encode()))


def _verdict(n: int, significant: bool, invalid: str = "") -> str:
    if invalid:
        return "invalid values"
    if n < 2:
        return "too few seeds"
    return "significant" if significant else "not significant"


def _seed_list(seeds) -> str:
    return ",".join(str(s) for s in seeds)


def evaluate(
    runs: pd.DataFrame, contrasts: Sequence[Contrast], alpha: float = ALPHA,
    n_resamples: int = stats.N_RESAMPLES, seed: int = stats.BOOTSTRAP_SEED,
    include_invalid: bool = True,
) -> pd.DataFrame:
    """One row per contrast.

    ``arms_invalid`` says why a contrast's arms are not valid (a run whose
    validity verdict failed, or a pair without parity: `harness.validity`);
    unless ``include_invalid``, such a contrast is left out of its Holm family
    (``p_holm`` NaN, verdict "arms not valid").

    Primary: the geometric mean ratio (``geo_mean_ratio``, ``effect_pct``)
    with its back-transformed log-scale t CI (``ci_low``/``ci_high`` on the
    ratio scale, ``effect_ci_low``/``effect_ci_high`` in %). Secondary: the
    arithmetic mean ratio (``mean_ratio``, ``mean_effect_pct``) with its t CI.
    Tests: p (t on log ratios), its Holm adjustment within the family,
    ``p_signflip`` (exact sign-flip permutation), ``p_wilcoxon``, and
    ``mde_pct`` (smallest change detectable with 80% power). ``unpaired``
    lists seeds only one arm ran; ``invalid`` names seeds whose values form
    no ratio (zero, negative, null): such a contrast is reported with no
    estimate and an untestable p that still counts in its Holm family.
    ``significant`` = p_holm < alpha AND the CI excludes 1 (``n_resamples``
    is kept for callers; ``seed`` seeds the sign-flip draws beyond exact size).
    """
    del n_resamples
    nan = math.nan
    rows = []
    for c in contrasts:
        p = pair(runs, c)
        num, den = p["num"].to_dict(), p["den"].to_dict()
        invalid = stats.invalid_pairs(num, den)
        row = {
            "family": c.family, "name": c.name, "metric": c.metric,
            "numerator": describe(c.numerator), "denominator": describe(c.denominator),
            "n": len(p) - len(invalid), "seeds": _seed_list(p.index),
            "unpaired": _seed_list(p.attrs["unpaired"]),
            "invalid": "; ".join(f"seed {s}: {why}" for s, why in invalid.items()),
            "mean_numerator": stats.mean_over_seeds(pd.to_numeric(p["num"], errors="coerce")),
            "mean_denominator": stats.mean_over_seeds(pd.to_numeric(p["den"], errors="coerce")),
            "arms_invalid": arms_invalid(runs, p, c.metric),
        }
        if invalid:
            row.update(geo_mean_ratio=nan, effect_pct=nan, ci_low=nan, ci_high=nan, effect_ci_low=nan,
                       effect_ci_high=nan, mean_ratio=nan, mean_effect_pct=nan, mean_ci_low=nan,
                       mean_ci_high=nan, p=nan, p_signflip=nan, p_wilcoxon=nan, mde_pct=nan)
        else:
            ratios = stats.paired_ratios(num, den)
            s = stats.summarize_ratios(list(ratios.values()), alpha, _rng(seed, c.name))
            row.update(
                geo_mean_ratio=s.geo_mean_ratio, effect_pct=s.effect_pct, ci_low=s.ci[0], ci_high=s.ci[1],
                effect_ci_low=stats.effect_pct(s.ci[0]), effect_ci_high=stats.effect_pct(s.ci[1]),
                mean_ratio=s.mean_ratio, mean_effect_pct=stats.effect_pct(s.mean_ratio),
                mean_ci_low=s.t_ci[0], mean_ci_high=s.t_ci[1],
                p=s.p, p_signflip=s.p_signflip, p_wilcoxon=s.p_wilcoxon, mde_pct=stats.effect_pct(s.mde_ratio),
            )
        rows.append(row)
    cols = list(rows[0]) if rows else ["family", "name", "metric", "n", "p", "ci_low", "ci_high", "invalid"]
    df = pd.DataFrame(rows, columns=cols)
    df["excluded"] = (df["arms_invalid"] != "") if not include_invalid and len(df) else False
    return _finish(df, null=1.0, alpha=alpha)


def arms_invalid(runs: pd.DataFrame, paired: pd.DataFrame, metric: str) -> str:
    """Why the arms of a seed-paired table cannot test ``metric``, in one
    line ("" when they can): how many of its runs are not valid for the
    metric's kind and which checks spoiled it (`harness.validity`: a growing
    queue spoils latency, not throughput), and the pairs without parity."""
    by_id = runs.set_index("run_id")
    column = valid_column(metric)
    problems = []
    if column in by_id.columns:
        kind = metric_kind(metric)
        ids = sorted(set(paired["num_run"]) | set(paired["den_run"]))
        bad = [r for r in ids if not bool(by_id.at[r, column])]
        if bad:
            checks: list[str] = []
            for r in bad:
                failed = str(by_id.at[r, "invalid_reasons"] or "").split(", ")
                checks += [c for c in spoiling_checks(failed, kind) if c not in checks]
            why = "; ".join(f"{c}: {CHECK_WORDS.get(c, c)}" for c in checks)
            problems.append(f"{kind_words(kind)} not valid in {len(bad)} of {len(ids)} runs ({why})")
    for s, row in paired.iterrows():
        parity = arm_parity(by_id.loc[row["num_run"]].to_dict(), by_id.loc[row["den_run"]].to_dict())
        if parity:
            problems.append(f"seed {s}: {'; '.join(parity)}")
    return "; ".join(problems)


def _finish(df: pd.DataFrame, null: float | None, alpha: float) -> pd.DataFrame:
    """Holm within each family, then the significance flag and verdict."""
    df["p_holm"] = np.nan
    excluded = df["excluded"] if "excluded" in df.columns else pd.Series(False, index=df.index)
    kept = df[~excluded.astype(bool)]
    for _, idx in kept.groupby("family", sort=False).groups.items():
        df.loc[idx, "p_holm"] = stats.holm(df.loc[idx, "p"].to_numpy(dtype=float))
    sig = []
    for _, r in df.iterrows():
        nul = null if null is not None else (0.0 if r["kind"] == "difference" else 1.0)
        sig.append(stats.is_significant(r["p_holm"], (r["ci_low"], r["ci_high"]), nul, alpha))
    df["significant"] = sig
    n = df["n"] if "n" in df.columns else df[["n_a", "n_b"]].min(axis=1)
    invalid = df["invalid"] if "invalid" in df.columns else pd.Series("", index=df.index)
    df["verdict"] = [_verdict(int(k), s, inv) for k, s, inv in zip(n, sig, invalid, strict=True)]
    df.loc[excluded.astype(bool), "verdict"] = "arms not valid"
    return df


def evaluate_interactions(
    runs: pd.DataFrame, contrasts: Sequence[Contrast], interactions: Sequence[Interaction],
    alpha: float = ALPHA, n_resamples: int = stats.N_RESAMPLES, seed: int = stats.BOOTSTRAP_SEED,
    include_invalid: bool = True,
) -> pd.DataFrame:
    """One row per interaction: estimate (pp for a difference, ratio for a
    ratio of ratios), effect (pp or %), t and bootstrap CIs, p, Holm p within
    each family, significance (CI must exclude 0 pp / ratio 1).
    ``arms_invalid`` joins its two contrasts' (`arms_invalid`); unless
    ``include_invalid`` such an interaction leaves its Holm family, as a
    contrast does in `evaluate`."""
    by_name = {c.name: c for c in contrasts}
    rows = []
    for it in interactions:
        missing = [n for n in (it.a, it.b) if n not in by_name]
        if missing:
            raise HbenchError(f"interaction {it.name!r}: unknown contrast {missing[0]!r}")
        ca, cb = by_name[it.a], by_name[it.b]
        if ca.metric != cb.metric:
            raise HbenchError(f"interaction {it.name!r}: contrasts use different metrics")
        ra, rb = contrast_ratios(runs, ca), contrast_ratios(runs, cb)
        fn = stats.interaction_difference if it.kind == "difference" else stats.ratio_of_ratios
        s = fn(ra, rb, _rng(seed, it.name), n_resamples)
        to_effect = (lambda v: v) if it.kind == "difference" else stats.effect_pct
        rows.append({
            "family": it.family, "name": it.name, "kind": it.kind, "metric": ca.metric,
            "a": it.a, "b": it.b, "paired": s.paired, "n_a": s.n_a, "n_b": s.n_b,
            "estimate": s.estimate, "effect": s.effect_pct, "unit": "pp" if it.kind == "difference" else "%",
            "ci_low": s.t_ci[0], "ci_high": s.t_ci[1],
            "effect_ci_low": to_effect(s.t_ci[0]), "effect_ci_high": to_effect(s.t_ci[1]),
            "boot_effect_low": to_effect(s.boot_ci[0]), "boot_effect_high": to_effect(s.boot_ci[1]),
            "p": s.p,
            "arms_invalid": "; ".join(x for x in (arms_invalid(runs, pair(runs, c), c.metric)
                                                  for c in (ca, cb)) if x),
        })
    cols = list(rows[0]) if rows else ["family", "name", "kind", "n_a", "n_b", "ci_low", "ci_high", "p",
                                       "arms_invalid"]
    df = pd.DataFrame(rows, columns=cols)
    df["excluded"] = (df["arms_invalid"] != "") if not include_invalid and len(df) else False
    return _finish(df, null=None, alpha=alpha)


def group_keys(runs: pd.DataFrame) -> list[str]:
    """Configuration fields that define a design cell apart from org and seed."""
    return [k for k in config_keys(runs) if k not in ("org", "seed") and k not in VOLATILE_KEYS]


def norm_value(v):
    """A config value as a plain hashable Python value (missing -> None)."""
    if _is_missing(v):
        return None
    return v.item() if isinstance(v, np.generic) else v


def varying_keys(runs: pd.DataFrame, keys: Iterable[str]) -> list[str]:
    """The ``keys`` that take more than one value in ``runs``."""
    return [k for k in keys if len({norm_value(v) for v in runs[k]}) > 1]


def cells(runs: pd.DataFrame, keys: Sequence[str]) -> Iterator[tuple[dict, pd.DataFrame]]:
    """Group ``runs`` by the values of ``keys`` (missing values group
    together, unlike pandas' groupby), in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(runs[list(keys)].itertuples(index=False)):
        groups.setdefault(tuple(norm_value(v) for v in row), []).append(i)
    for label, idx in groups.items():
        yield dict(zip(keys, label, strict=True)), runs.iloc[idx]


def _registry_order(org: str) -> tuple[int, str]:
    return (ORG_NAMES.index(org) if org in ORG_NAMES else len(ORG_NAMES), org)


def org_pairs(orgs: Iterable[str], reference: str | None = None) -> list[tuple[str, str]]:
    """The (numerator, denominator) organizations `auto_contrasts` compares
    among ``orgs``: every other one over ``reference`` when given (none when
    it is absent), else every pair, the later in the registry's order over
    the earlier (S1/S0, S2/S0, D0/S2, ...)."""
    ordered = sorted(set(orgs), key=_registry_order)
    if reference is not None:
        return [(o, reference) for o in ordered if o != reference] if reference in ordered else []
    return [(b, a) for i, a in enumerate(ordered) for b in ordered[i + 1:]]


def auto_contrasts(runs: pd.DataFrame, metrics: Sequence[str] | None = None,
                   reference: str | None = None) -> list[Contrast]:
    """The `org_pairs` of every design cell, per metric (one Holm family per
    metric). ``metrics`` None: those of `DEFAULT_METRICS` the runs have."""
    if metrics is None:
        metrics = [m for m in DEFAULT_METRICS if m in runs.columns] or [DEFAULT_METRIC]
    for m in metrics:
        if m not in runs.columns:
            raise HbenchError(f"unknown metric {m!r}; the run summaries have no such column")
    if reference is not None and reference not in set(runs["org"]):
        raise HbenchError(f"--reference {reference}: no run of {reference} under the results "
                          f"(organizations there: {', '.join(sorted(set(runs['org'])))})")
    keys = group_keys(runs)
    label_keys = varying_keys(runs, keys)
    out = []
    for where, cell in cells(runs, keys):
        label = ", ".join(f"{k}={where[k]}" for k in label_keys)
        for num, den in org_pairs(cell["org"], reference):
            for m in metrics:
                name = f"{num}/{den}" + (f" @ {label}" if label else "") + ("" if len(metrics) == 1 else f" [{m}]")
                out.append(Contrast(name, m, {**where, "org": num}, {**where, "org": den}, family=m))
    return out


def arm_means(runs: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Absolute numbers per arm (design cell x org): run count and the
    arithmetic mean over seeds of each metric with its t CI -- for latency
    metrics that is the mean over seeds of run-level p99."""
    keys = ["org"] + varying_keys(runs, group_keys(runs))
    rows = []
    for where, arm in sorted(cells(runs, keys), key=lambda c: [str(v) for v in c[0].values()]):
        row = {**where, "runs": len(arm)}
        for m in metrics:
            vals = pd.to_numeric(arm[m], errors="coerce").dropna().to_numpy()
            row[m] = stats.mean_over_seeds(vals)
            row[f"{m}_ci_low"], row[f"{m}_ci_high"] = stats.t_interval(vals)
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Design:
    """Contrasts and interactions read from a design (TOML) file."""

    contrasts: tuple[Contrast, ...]
    interactions: tuple[Interaction, ...] = ()


def load_design(path) -> Design:
    """Read ``[[contrast]]`` and ``[[interaction]]`` tables from a TOML file.

    ``[[contrast]]``: name, metric (default throughput_ledger_tok_s), family
    (default the metric), numerator and denominator (inline tables of column
    = value). ``[[interaction]]``: name, a, b (contrast names), kind
    ("difference" or "ratio"), family (default "interactions").
    """
    path = Path(path)
    text = read_input_text(path, "--design", MAX_DESIGN_BYTES)
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:   # deep nesting recurses in tomllib
        raise HbenchError(f"cannot read design file {path}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None
    contrasts, interactions = [], []
    for i, t in enumerate(doc.get("contrast", [])):
        unknown = set(t) - {"name", "metric", "family", "numerator", "denominator"}
        if unknown or "name" not in t or "numerator" not in t or "denominator" not in t:
            raise HbenchError(f"{path}: contrast #{i + 1} needs name, numerator, denominator (unknown keys: {sorted(unknown)})")
        metric = t.get("metric", DEFAULT_METRIC)
        contrasts.append(Contrast(t["name"], metric, dict(t["numerator"]), dict(t["denominator"]), t.get("family", metric)))
    for i, t in enumerate(doc.get("interaction", [])):
        unknown = set(t) - {"name", "a", "b", "kind", "family"}
        if unknown or not {"name", "a", "b"} <= set(t):
            raise HbenchError(f"{path}: interaction #{i + 1} needs name, a, b (unknown keys: {sorted(unknown)})")
        interactions.append(Interaction(t["name"], t["a"], t["b"], t.get("kind", "difference"), t.get("family", "interactions")))
    if not contrasts:
        raise HbenchError(f"{path}: no [[contrast]] tables")
    names = [c.name for c in contrasts]
    if len(set(names)) != len(names):
        raise HbenchError(f"{path}: contrast names must be unique")
    return Design(tuple(contrasts), tuple(interactions))
