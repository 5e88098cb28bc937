"""The study's experiment designs (DESIGN.md section 9) as data.

Each `ExperimentDesign` is a grid (a union of axis sets over `RunConfig`
fields, expanded by `harness.grid.expand`), the paired seeds it runs on,
and the contrast and interaction families `analysis.contrasts` evaluates.
`hbench reproduce NAME` runs the grid and evaluates the families; nothing
here holds a result.

Every design starts from the study's main working point (`WORKING_POINT`:
3 req/s, cap 63, headroom 0, SHARE, q = 1, b63) and overrides what it
varies. Seeds are the study's where DESIGN.md names them (Q6 76400-76411,
Q8 79010-79012, Q9 88001-88006); elsewhere we use 1-6 (Q7: 1-3, the
study's count). ``quick`` variants keep the grid and the contrasts but run
fewer seeds and 120 requests, for a smoke-sized reproduction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from analysis.contrasts import Contrast, Interaction
from harness.config import RunConfig
from harness.grid import expand

THROUGHPUT = "throughput_ledger_tok_s"
SPAN_THROUGHPUT = "throughput_span_tok_s"
QUICK_REQUESTS = 120
FULL_REQUESTS = 240

WORKING_POINT: dict = {"rate": 3.0, "cap": 63, "headroom": 0.0, "isolate": False, "q": 1.0,
                       "budget": "b63", "retention": False}
HEADROOMS = (0.0, 0.10, 0.19, 0.27, 0.35)
BUDGETS = ("b63", "b83", "b108")
RATES = (0.8, 3.0, 4.5)


@dataclass(frozen=True)
class ExperimentDesign:
    """One of the study's designs: what to run and which contrasts to test."""

    name: str
    title: str
    grids: tuple[Mapping, ...]
    seeds: tuple[int, ...]
    quick_seeds: tuple[int, ...]
    contrasts: tuple[Contrast, ...] = ()
    interactions: tuple[Interaction, ...] = ()
    metrics: tuple[str, ...] = (THROUGHPUT,)     # reported as arm means
    notes: str = ""
    base: Mapping = field(default_factory=lambda: dict(WORKING_POINT))
    #: axis sets of the ``quick`` variant when they differ from ``grids`` (a
    #: design whose axis sets fix their own request counts)
    quick_grids: tuple[Mapping, ...] | None = None

    def axes(self, quick: bool = False) -> tuple[dict, list[dict]]:
        """(base, axis sets) for `harness.grid.expand`."""
        seeds = self.quick_seeds if quick else self.seeds
        base = {**self.base, "seed": list(seeds),
                "requests": QUICK_REQUESTS if quick else FULL_REQUESTS}
        grids = self.quick_grids if quick and self.quick_grids is not None else self.grids
        return base, [dict(g) for g in grids]

    def configs(self, quick: bool = False) -> list[RunConfig]:
        base, grids = self.axes(quick)
        return expand(grids, base)


def _ratio(name: str, num: Mapping, den: Mapping, family: str, metric: str = THROUGHPUT) -> Contrast:
    return Contrast(name, metric, dict(num), dict(den), family)


def _q1() -> ExperimentDesign:
    contrasts = []
    for q in (0.0, 0.5, 1.0):
        contrasts.append(_ratio(f"S1/S0 q={q:g}", {"org": "s1", "q": q}, {"org": "s0", "q": q}, "Q1"))
        contrasts.append(_ratio(f"S2/S1 q={q:g}", {"org": "s2", "q": q}, {"org": "s1", "q": q}, "Q1"))
    inter = tuple(Interaction(f"{pair} q=1 minus q=0", f"{pair} q=1", f"{pair} q=0", "difference",
                              "Q1-interactions") for pair in ("S1/S0", "S2/S1"))
    return ExperimentDesign(
        "q1", "Q1 sharing: S0, S1, S2 at q in {0, 0.5, 1}",
        grids=({"org": ["s0", "s1", "s2"], "q": [0.0, 0.5, 1.0]},),
        seeds=tuple(range(1, 7)), quick_seeds=(1, 2, 3),
        contrasts=tuple(contrasts), interactions=inter,
        notes="Six contrasts in one Holm family; endpoint interactions (q=1 minus q=0) in pp.")


def _q2() -> ExperimentDesign:
    contrasts = []
    for budget in ("b63", "b108"):
        for num, den in (("s1", "s0"), ("s2", "s1")):
            contrasts.append(_ratio(f"{num.upper()}/{den.upper()} initial input {budget}",
                                    {"org": num, "budget": budget}, {"org": den, "budget": budget},
                                    "Q2", "initial_input_tokens"))
    return ExperimentDesign(
        "q2", "Q2 served-state counters: S0..S2 at (b63, 3 req/s) and (b108, 4.5 req/s)",
        grids=({"org": ["s0", "s1", "s2"], "budget": "b63", "rate": 3.0, "cap": 63},
               {"org": ["s0", "s1", "s2"], "budget": "b108", "rate": 4.5, "cap": 109}),
        seeds=tuple(range(1, 7)), quick_seeds=(1, 2),
        contrasts=tuple(contrasts),
        metrics=("initial_input_tokens", "waiting_median", "running_median", THROUGHPUT),
        notes="The b108 point uses cap 109, as the study's b108 load experiment did.")


def _q3() -> ExperimentDesign:
    contrasts = (
        _ratio("S1/S0 q=0", {"org": "s1"}, {"org": "s0"}, "Q3"),
        _ratio("S2/S1 q=0", {"org": "s2"}, {"org": "s1"}, "Q3"),
        _ratio("S1/S0 initial input q=0", {"org": "s1"}, {"org": "s0"}, "Q3-input", "initial_input_tokens"),
        _ratio("S2/S1 initial input q=0", {"org": "s2"}, {"org": "s1"}, "Q3-input", "initial_input_tokens"),
    )
    return ExperimentDesign(
        "q3", "Q3 no-share control (q = 0): S0, S1, S2",
        grids=({"org": ["s0", "s1", "s2"], "q": 0.0},),
        seeds=tuple(range(1, 7)), quick_seeds=(1, 2),
        contrasts=contrasts, metrics=(THROUGHPUT, "initial_input_tokens", "preemptions"),
        notes="Initial input work must be identical across organizations (ratio exactly 1).")


def _q4() -> ExperimentDesign:
    contrasts = tuple(_ratio(f"D0/S2 {b}", {"org": "d0", "budget": b}, {"org": "s2", "budget": b}, "Q4")
                      for b in BUDGETS)
    return ExperimentDesign(
        "q4", "Q4 budget: D0 vs S2 at b63, b83, b108 (3 req/s, cap 63, f = 0)",
        grids=({"org": ["s2", "d0"], "budget": list(BUDGETS)},),
        seeds=tuple(range(1, 7)), quick_seeds=(1, 2), contrasts=contrasts,
        notes="D0 splits each budget 50/50 between its pools (RunConfig.d0_attn_fraction).")


def _q5() -> ExperimentDesign:
    points = (("b63", 63), ("b108", 109))
    contrasts = tuple(
        _ratio(f"D0/S2 {b} cap{cap} rate={r:g}", {"org": "d0", "budget": b, "rate": r},
               {"org": "s2", "budget": b, "rate": r}, "Q5")
        for b, cap in points for r in RATES)
    return ExperimentDesign(
        "q5", "Q5 load: D0 vs S2 at 0.8, 3.0, 4.5 req/s, at b63/cap 63 and b108/cap 109",
        grids=tuple({"org": ["s2", "d0"], "rate": list(RATES), "budget": b, "cap": cap} for b, cap in points),
        seeds=tuple(range(1, 7)), quick_seeds=(1, 2), contrasts=contrasts)


def _q6() -> ExperimentDesign:
    contrasts = tuple(
        _ratio(f"D0/S2 {b} f={f:g}", {"org": "d0", "budget": b, "headroom": f},
               {"org": "s2", "budget": b, "headroom": f}, "Q6")
        for b in BUDGETS for f in HEADROOMS)
    return ExperimentDesign(
        "q6", "Q6 headroom: S2 and D0, f in {0, .10, .19, .27, .35} x b63/b83/b108",
        grids=({"org": ["s2", "d0"], "headroom": list(HEADROOMS), "budget": list(BUDGETS)},),
        seeds=tuple(range(76400, 76412)), quick_seeds=(76400, 76401), contrasts=contrasts,
        notes="Common-headroom contrasts are declared; each org at its own best headroom is "
              "selected on the same runs (see selected_headroom_contrasts), so it is descriptive.")


def _q7() -> ExperimentDesign:
    contrasts = tuple(
        _ratio(f"f=0.19/f=0 {label}", {"headroom": 0.19}, {"headroom": 0.0}, "Q7", metric)
        for label, metric in (("R_max", "r_max_mean"), ("J_adopt", "j_adopt_mean"),
                              ("throughput", THROUGHPUT)))
    return ExperimentDesign(
        "q7", "Q7 joint depth: S2 at b83, f in {0, 0.19}",
        grids=({"org": "s2", "budget": "b83", "headroom": [0.0, 0.19]},),
        seeds=(1, 2, 3), quick_seeds=(1, 2), contrasts=contrasts,
        metrics=("r_max_mean", "j_adopt_mean", "gap_r_mean", THROUGHPUT),
        notes="Gap_R = R_max - J_adopt per run (mean over requests), reported as an arm mean.")


def _q8() -> ExperimentDesign:
    metrics = (("ledger", THROUGHPUT), ("span", SPAN_THROUGHPUT), ("J_adopt", "j_adopt_mean"),
               ("attention depth", "attn_depth_mean"))
    contrasts = tuple(_ratio(f"retention/none {label}", {"retention": True}, {"retention": False},
                             "Q8", metric) for label, metric in metrics)
    return ExperimentDesign(
        "q8", "Q8 retention: S2 vs S2+retention at a fixed 254-page S2 budget",
        grids=({"org": "s2", "budget": "254p", "retention": [False, True]},),
        seeds=(79010, 79011, 79012), quick_seeds=(79010, 79011), contrasts=contrasts,
        metrics=(THROUGHPUT, SPAN_THROUGHPUT, "j_adopt_mean", "attn_depth_mean"))


def _q9() -> ExperimentDesign:
    contrasts = (
        _ratio("retention/none SHARE", {"retention": True, "isolate": False},
               {"retention": False, "isolate": False}, "Q9"),
        _ratio("retention/none ISOLATE", {"retention": True, "isolate": True},
               {"retention": False, "isolate": True}, "Q9"),
    )
    return ExperimentDesign(
        "q9", "Q9 crossover: {S2, S2+retention} x {SHARE, ISOLATE}",
        grids=({"org": "s2", "budget": "254p", "retention": [False, True], "isolate": [False, True]},),
        seeds=tuple(range(88001, 88007)), quick_seeds=(88001, 88002, 88003), contrasts=contrasts,
        interactions=(Interaction("K_ret", "retention/none SHARE", "retention/none ISOLATE", "ratio",
                                  "Q9-interactions"),),
        notes="Budget 254p as in Q8. Run order is irrelevant to the deterministic simulator.")


# ---------------------------------------------------------------- beyond the study

#: The checkpoint policies the design crosses with the organizations:
#: label -> (publish, evict, utility alpha). The study's (every boundary, LRU),
#: Marconi's admission alone, Marconi's eviction alone (alpha fixed at the
#: default 1) and Marconi whole (admission + eviction, alpha tuned online).
BEYOND_POLICIES = {
    "every/lru": ("every", "lru", 1.0),
    "marconi/lru": ("marconi", "lru", 1.0),
    "every/utility": ("every", "utility", 1.0),
    "marconi/utility-auto": ("marconi", "utility", "auto"),
}
BEYOND_BASELINE = "every/lru"
BEYOND_ORGS = ("d0", "u0", "e0", "s2")
BEYOND_REFERENCE_ORG = "d0"
BEYOND_BUDGETS = ("b63", "b108")
#: workload label -> (axis values, quick axis values): the study's shared
#: contexts (``requests`` from the design: 240, quick 120) and multi-turn
#: sessions (``requests`` counts sessions: 60, quick 30)
BEYOND_WORKLOADS = {
    "sharegpt": ({"workload_kind": "sharegpt"}, {"workload_kind": "sharegpt"}),
    "multiturn": ({"workload_kind": "multiturn", "requests": 60},
                  {"workload_kind": "multiturn", "requests": 30}),
}
BEYOND_METRICS = (THROUGHPUT, "ttft_p99_s")
TOKEN_HIT_RATE = "token_hit_rate"


def policy_where(label: str) -> dict:
    """The run-table filter of policy ``label`` (a key of `BEYOND_POLICIES`)."""
    publish, evict, alpha = BEYOND_POLICIES[label]
    return {"ckpt_publish": publish, "ckpt_evict": evict, "utility_alpha": alpha}


def _beyond_grids(quick: bool) -> tuple[dict, ...]:
    return tuple({"org": list(BEYOND_ORGS), "budget": list(BEYOND_BUDGETS),
                  "ckpt_publish": publish, "ckpt_evict": evict, "utility_alpha": alpha,
                  **(wl[1] if quick else wl[0])}
                 for publish, evict, alpha in BEYOND_POLICIES.values()
                 for wl in BEYOND_WORKLOADS.values())


def _beyond() -> ExperimentDesign:
    """Organization x checkpoint policy, at two budgets, on two workloads.

    Families (Holm within each): which organization (each vs D0 under the
    study's policy, per workload x budget, for throughput and for TTFT p99);
    which policy (each vs every/lru within each organization, per workload x
    budget, per metric); the interaction (does the policy effect depend on the
    organization: each policy's effect on an organization minus its effect on
    D0, in pp, throughput); and Marconi's cross-check (token hit rate of
    Marconi whole over every/lru on multi-turn sessions, per organization and
    budget: Marconi reports it higher)."""
    contrasts, inter = [], []
    for wl in BEYOND_WORKLOADS:
        for b in BEYOND_BUDGETS:
            cell = {"workload_kind": wl, "budget": b}
            base_pol = policy_where(BEYOND_BASELINE)
            for metric, tag in ((THROUGHPUT, "throughput"), ("ttft_p99_s", "TTFT p99")):
                for org in BEYOND_ORGS:
                    if org != BEYOND_REFERENCE_ORG:
                        contrasts.append(_ratio(
                            f"{org.upper()}/D0 {tag} {wl} {b}",
                            {"org": org, **cell, **base_pol},
                            {"org": BEYOND_REFERENCE_ORG, **cell, **base_pol},
                            f"which organization ({tag})", metric))
                for org in BEYOND_ORGS:
                    for pol in BEYOND_POLICIES:
                        if pol != BEYOND_BASELINE:
                            contrasts.append(_ratio(
                                f"{pol} / {BEYOND_BASELINE} {tag} {org} {wl} {b}",
                                {"org": org, **cell, **policy_where(pol)},
                                {"org": org, **cell, **base_pol},
                                f"which policy ({tag})", metric))
            for org in BEYOND_ORGS:
                if org == BEYOND_REFERENCE_ORG:
                    continue
                for pol in BEYOND_POLICIES:
                    if pol != BEYOND_BASELINE:
                        inter.append(Interaction(
                            f"{pol} effect on {org} minus on d0, throughput {wl} {b}",
                            f"{pol} / {BEYOND_BASELINE} throughput {org} {wl} {b}",
                            f"{pol} / {BEYOND_BASELINE} throughput d0 {wl} {b}",
                            "difference", "policy x organization (throughput)"))
    for org in BEYOND_ORGS:
        for b in BEYOND_BUDGETS:
            cell = {"org": org, "workload_kind": "multiturn", "budget": b}
            contrasts.append(_ratio(
                f"Marconi cross-check: token hit rate {org} multiturn {b}",
                {**cell, **policy_where("marconi/utility-auto")},
                {**cell, **policy_where(BEYOND_BASELINE)},
                "Marconi cross-check (token hit rate)", TOKEN_HIT_RATE))
    return ExperimentDesign(
        "beyond", "Beyond the study: organization x checkpoint policy at b63 and b108, "
                  "shared contexts and multi-turn sessions",
        grids=_beyond_grids(False), quick_grids=_beyond_grids(True),
        seeds=tuple(range(1, 7)), quick_seeds=(1, 2),
        contrasts=tuple(contrasts), interactions=tuple(inter),
        metrics=(THROUGHPUT, "ttft_p99_s", "ttft_p50_s", TOKEN_HIT_RATE, "capacity_move_s"),
        notes="Policies: every/lru (the study), marconi/lru (Marconi's admission), every/utility "
              "(Marconi's eviction, alpha 1), marconi/utility-auto (Marconi whole, alpha tuned "
              "online). Multi-turn runs count 60 sessions (quick: 30); the shared-context runs "
              "240 requests (quick: 120). token_hit_rate = reused / (reused + initial input) "
              "tokens, `hbench reuse`'s token hit rate.")


DESIGNS: dict[str, ExperimentDesign] = {d.name: d for d in (
    _q1(), _q2(), _q3(), _q4(), _q5(), _q6(), _q7(), _q8(), _q9(), _beyond())}


def selected_headroom_contrasts(runs, budgets: Sequence[str] = BUDGETS,
                                metric: str = THROUGHPUT) -> list[Contrast]:
    """Q6's "each org at its own headroom": per budget, D0 at its best f over
    S2 at its best f (best = highest mean ``metric`` over seeds in ``runs``).

    The selection uses the same runs it is then evaluated on, so these
    contrasts describe the data; the study preselected on other seeds.
    """
    out = []
    for b in budgets:
        best = {}
        for org in ("d0", "s2"):
            arm = runs[(runs["org"] == org) & (runs["budget"] == b)]
            if arm.empty:
                break
            best[org] = float(arm.groupby("headroom")[metric].mean().idxmax())
        if len(best) == 2:
            out.append(_ratio(f"D0 f={best['d0']:g} / S2 f={best['s2']:g} {b} (own best headroom)",
                              {"org": "d0", "budget": b, "headroom": best["d0"]},
                              {"org": "s2", "budget": b, "headroom": best["s2"]}, "Q6-selected", metric))
    return out


def design(name: str) -> ExperimentDesign:
    from common.errors import HbenchError

    if name not in DESIGNS:
        raise HbenchError(f"unknown design {name!r}; choose from {', '.join(DESIGNS)} or all")
    return DESIGNS[name]
