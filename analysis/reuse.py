"""Prefix reuse as Marconi (MLSys'25) reports it, from a run's request table.

Every run's ``requests.parquet`` holds each request's ``prompt_tokens`` and
``reused_tokens`` (the joint-hit depth J it adopted on first admission), so
these are computed at analysis time for any run, old or new, whatever its
checkpoint policy, and no summary key changes:

    token hit rate    sum reused_tokens / sum prompt_tokens
    request hit rate  requests with reused_tokens > 0 / requests
    FLOPs saved       sum over requests of the FLOPs of their reused prefix
                      (`harness.prefix_flops.prefix_flops` of the run's model)

over the measured (non-warm-up) requests whose reuse the engine observed,
as the summary counts ``reused_tokens`` (a served run against a server that
reports no cached tokens has none: NaN, not 0).
"""

from __future__ import annotations

import math

import pandas as pd

from harness.config import RunConfig
from harness.model_configs import geometry_for_run
from harness.prefix_flops import prefix_flops

#: the columns `reuse_metrics` adds, in order
REUSE_KEYS = ("token_hit_rate", "request_hit_rate", "flops_saved")


def reuse_metrics(requests: pd.DataFrame, geometry) -> dict[str, float]:
    """`REUSE_KEYS` of one run's request table (NaN without a measured request
    whose reuse was observed)."""
    measured = requests[~requests["warmup"].astype(bool)]
    measured = measured[measured["reused_tokens"].notna()]
    prompt = int(measured["prompt_tokens"].sum())
    reused = measured["reused_tokens"].astype(int)
    n = len(measured)
    return {
        "token_hit_rate": int(reused.sum()) / prompt if prompt else math.nan,
        "request_hit_rate": int((reused > 0).sum()) / n if n else math.nan,
        "flops_saved": (float(sum(prefix_flops(geometry, int(j)) for j in reused if j > 0))
                        if n else math.nan),
    }


#: summary keys a reuse table shows beside them
SUMMARY_COLUMNS = ("j_adopt_mean", "invalidations_checkpoint", "ttft_p99_s",
                   "throughput_ledger_tok_s")
#: configuration fields a reuse table groups by (those that vary are shown)
ARM_KEYS = ("org", "budget", "ckpt_publish", "ckpt_every_k", "ckpt_evict", "utility_alpha",
            "workload_kind", "q", "rate", "paging", "retention", "isolate")


def reuse_table(runs) -> pd.DataFrame:
    """One row per run (`harness.results.Run` objects): its arm's varying
    configuration fields, seed, `REUSE_KEYS` and `SUMMARY_COLUMNS`."""
    rows, geoms = [], {}
    for run in runs:
        config = RunConfig.from_dict(dict(run.config))
        gkey = (config.model, config.config_path, config.ssm_state_dtype)
        if gkey not in geoms:
            geoms[gkey] = geometry_for_run(config)
        row = {k: run.config.get(k) for k in ARM_KEYS}
        row["seed"] = run.config.get("seed")
        row.update(reuse_metrics(run["requests"], geoms[gkey]))
        row.update({k: run.summary.get(k) for k in SUMMARY_COLUMNS})
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    keep = [k for k in ARM_KEYS if df[k].astype(str).nunique() > 1]
    return df[[*keep, "seed", *REUSE_KEYS, *SUMMARY_COLUMNS]]


def arm_means(table: pd.DataFrame) -> pd.DataFrame:
    """`reuse_table`'s rows averaged over seeds within each arm (``runs``: how many)."""
    keys = [c for c in table.columns if c in ARM_KEYS]
    values = [*REUSE_KEYS, *SUMMARY_COLUMNS]
    if not keys:
        out = table[values].mean().to_frame().T
        out.insert(0, "runs", len(table))
        return out
    grouped = table.groupby(keys, sort=True, dropna=False)
    out = grouped[values].mean().reset_index()
    out.insert(len(keys), "runs", grouped.size().to_numpy())
    return out
