"""The per-request table of a run: one row per request, as ``requests.parquet`` holds it.

`request_columns` reads the run's `harness.request_table.RequestTable` (a
row per request, whichever engine filled it) and adds what is derived per
request (TTFT, end-to-end, TPOT; a multi-turn run's history columns,
`turn_history`); `per_request_table` makes those columns the Arrow table a
results directory stores. `REQUEST_COLUMNS` (and `TURN_COLUMNS`) are the
contract analysis reads by name. Kept apart from the run summary
(`harness.metrics`), which reads the same table.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from harness.records import FINISHED, EngineRun
from harness.token_times import percentiles

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

NAN = float("nan")

# Columns of `per_request_table`, in order, with the NumPy dtype each is built
# as ("object": text, a list of str, written as an Arrow string column;
# `NULLABLE_INT`: a whole count that may be missing, built as float64 with
# NaN for None and written as an Arrow int64 column with nulls).
NULLABLE_INT = "Int64"
REQUEST_COLUMNS = {
    "request_id": "int64",
    "arrival_s": "float64",
    "dispatch_s": "float64",
    "first_token_s": "float64",
    "finish_s": "float64",
    "prompt_tokens": "int64",
    "target_output_tokens": "int64",
    "output_tokens": "int64",
    "reused_tokens": NULLABLE_INT,
    "initial_input_tokens": NULLABLE_INT,
    "recomputed_tokens": NULLABLE_INT,
    "preemptions": NULLABLE_INT,
    "j_adopt": NULLABLE_INT,
    "r_max": NULLABLE_INT,
    "attn_depth": NULLABLE_INT,
    "prefix_group": "int64",
    "status": "object",
    "error": "object",
    "warmup": "bool",
    "ttft_s": "float64",
    "e2e_s": "float64",
    "itl_mean_s": "float64",
    "itl_p50_s": "float64",
    "itl_p99_s": "float64",
    "itl_max_s": "float64",
    "tpot_s": "float64",
    "n_token_times": "int64",
}

# Multi-turn runs (requests with a turn index) add these columns.
TURN_COLUMNS = {
    "session": "int64",
    "turn": "int64",
    "history_tokens": "int64",
    "history_recomputed_tokens": NULLABLE_INT,
    "history_survived": "float64",
}


def _grid(run: EngineRun) -> int:
    return int(run.engine_info.get("grid_tokens") or 1)


def turn_history(run: EngineRun) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request of the run's table, in its order: (history tokens, history
    tokens recomputed, survived) where history is what the previous turn of
    its session left reusable (its prompt plus its output), recomputed =
    history minus the reused tokens (at least 0), and survived is 1.0 if the
    request reused at least the previous turn's deepest grid point inside
    its prompt (the state that turn's prefill left in the cache outlived the
    think time), 0.0 if not, NaN for first turns and turns whose previous
    prompt is shorter than one grid interval. A request without a previous
    turn has (0, 0, NaN); one whose reuse was not observed has recomputed
    NaN (not observed) and survived NaN. Arrays: int64, float64, float64."""
    table = run.requests
    grid = _grid(run)
    session, turn = table.array("session").tolist(), table.array("turn").tolist()
    prompt, out = table.array("prompt_tokens").tolist(), table.array("output_tokens").tolist()
    reused = table.array("reused_tokens")
    row = {(s, k): i for i, (s, k) in enumerate(zip(session, turn, strict=True)) if k >= 0}
    n = len(turn)
    history = np.zeros(n, dtype=np.int64)
    recomputed = np.zeros(n, dtype=np.float64)
    survived = np.full(n, NAN)
    for (s, k), i in row.items():
        prev = row.get((s, k - 1))
        if prev is None:
            continue
        history[i] = h = prompt[prev] + out[prev]
        if math.isnan(reused[i]):
            recomputed[i] = NAN
            continue
        best = prompt[prev] // grid * grid
        got = int(reused[i])
        survived[i] = NAN if best == 0 else float(got >= best)
        recomputed[i] = max(0, h - got)
    return history, recomputed, survived


def request_columns(run: EngineRun) -> dict[str, np.ndarray | list]:
    """The columns of `per_request_table`, in order: NumPy arrays of their
    `REQUEST_COLUMNS` dtypes (and a multi-turn run's `TURN_COLUMNS`), a text
    column as a list of str, from the run's request table. Missing times
    are NaN, and so are counters the engine did not observe (`NULLABLE_INT`
    columns are float64)."""
    table = run.requests
    arrival, first, finish = (table.array(f) for f in ("arrival_s", "first_token_s", "finish_s"))
    out = table.array("output_tokens")
    with np.errstate(divide="ignore", invalid="ignore"):
        tpots = np.where(out >= 2, (finish - first) / (out - 1), NAN)
    data = {"ttft_s": first - arrival, "e2e_s": finish - arrival, "tpot_s": tpots,
            "status": table.statuses(), "error": table.errors()}
    columns = dict(REQUEST_COLUMNS)
    if table.has_turns():
        columns.update(TURN_COLUMNS)
        data.update(zip(("history_tokens", "history_recomputed_tokens", "history_survived"),
                        turn_history(run), strict=True))
    return {name: data[name] if name in data else _typed(table.array(name), dtype)
            for name, dtype in columns.items()}


def _typed(values: np.ndarray, dtype: str) -> np.ndarray:
    """A table column as a `per_request_table` column of ``dtype`` (a
    `NULLABLE_INT` one float64, NaN where not observed)."""
    return np.asarray(values, dtype=np.float64 if dtype == NULLABLE_INT else dtype)


def per_request_table(run: EngineRun, columns: dict | None = None) -> pa.Table:
    """One row per request (warm-up included, flagged by ``warmup``), as
    ``requests.parquet`` holds it: `request_columns` (``columns``, where the
    caller has made them) as an Arrow table, a missing time a null and a
    text column ``string`` (``null`` when no row has text), as pandas wrote
    the same columns. A counter the engine did not observe is a null of an
    int64 column (`NULLABLE_INT`; pandas reads the column back as float64
    with NaN). Built through `common.arrow_arrays`, so writing it loads no
    pandas.

    Token times are summarized (ITL mean/p50/p99/max, count), not stored:
    they would dominate the file.
    """
    from common.arrow_arrays import table

    columns = request_columns(run) if columns is None else columns
    nullable = [name for name, dtype in {**REQUEST_COLUMNS, **TURN_COLUMNS}.items()
                if dtype == NULLABLE_INT and name in columns]
    return table(columns, nan_is_null=True, nullable_ints=nullable)


def turn_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per turn index (measured, finished requests of a multi-turn run's
    per-request table as read back): requests, TTFT p50 / mean, mean reused
    and history tokens, reuse fraction (reused / history) and survived
    fraction. An analysis of a table, so pandas is imported here: a run does
    not call it."""
    import pandas as pd

    df = requests[(~requests["warmup"]) & (requests["turn"] >= 0)
                  & (requests["status"] == FINISHED)]
    rows = []
    for k, g in df.groupby("turn", sort=True):
        hist = g["history_tokens"].sum()
        rows.append({
            "turn": int(k), "requests": len(g),
            "ttft_p50_s": percentiles(g["ttft_s"].dropna().to_numpy(), (50,))[0],
            "ttft_mean_s": float(g["ttft_s"].mean()),
            "reused_tokens_mean": float(g["reused_tokens"].mean()),
            "history_tokens_mean": float(g["history_tokens"].mean()),
            "reuse_fraction": (float(np.minimum(g["reused_tokens"], g["history_tokens"]).sum())
                               / float(hist)) if hist > 0 else NAN,
            "survived_fraction": float(g["history_survived"].mean()),
        })
    return pd.DataFrame(rows)

