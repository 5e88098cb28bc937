"""A factory that writes run directories in the results format (manifest,
summary, requests and steps tables), so every synthetic run an analysis test
reads looks exactly like what ``hbench run`` writes."""

from __future__ import annotations

import hashlib
import itertools
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from harness.config import RunConfig
from harness.run_address import address_of, new_run_id
from harness.seal import sealed

WORKLOAD_KEYS = ("rate", "arrival", "burstiness", "q", "requests", "duration_s", "contexts",
                 "max_model_len", "max_output", "warmup_requests", "seed")
SUMMARY_KEYS = (
    "throughput_ledger_tok_s", "throughput_span_tok_s", "output_tokens",
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
    "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s",
    "peak_mem_total_bytes", "peak_mem_attention_bytes", "peak_mem_ssm_bytes", "peak_mem_conv_bytes",
    "waiting_median", "running_median", "preemptions", "invalidations", "slab_occupancy_mean",
    "initial_input_tokens", "reused_tokens", "recomputed_tokens", "j_adopt_mean", "r_max_mean",
    "attn_depth_mean", "finished", "failed", "cancelled",
)


def workload_hash(config: dict) -> str:
    """Same workload recipe and seed -> same hash, as the real workload builder promises."""
    blob = json.dumps({k: config[k] for k in WORKLOAD_KEYS}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_WRITTEN = itertools.count(2)


def write_run(root, run_id: str, status: str = "complete", summary: dict | None = None,
              workload: str | None = None, tables: bool = False, n_requests: int = 8, **config) -> Path:
    """Write ``root/run_id`` in the results format; ``config`` overrides RunConfig defaults.

    The directory is named ``run_id``; its manifest records the content address
    `hbench run` would (`harness.run_address.new_run_id`, made unique with a
    ``-N`` suffix) and the size and sha256 of every file, as `read_run` requires."""
    run_config = RunConfig(**config)
    cfg = run_config.to_dict()
    d = Path(root) / run_id
    d.mkdir(parents=True, exist_ok=True)
    wl = workload if workload is not None else workload_hash(cfg)
    address = new_run_id(run_config, wl, now=datetime(2026, 1, 1, tzinfo=UTC))
    manifest = {
        "schema_version": 1, "run_id": f"{address}-{next(_WRITTEN)}", "config": cfg,
        "workload_hash": wl,
        "git_commit": "0" * 40, "packages": {"numpy": np.__version__}, "engine": cfg["engine"],
        "engine_version": "test", "org": cfg["org"],
        "budget": {"label": cfg["budget"], "pools": [{"name": "shared", "page_bytes": 524288, "pages": 100}]},
        "created_utc": "2026-01-01T00:00:00Z", "status": status,
    }
    if status == "complete":
        values = {k: 1.0 for k in SUMMARY_KEYS}
        values.update(summary or {})
        (d / "summary.json").write_text(json.dumps(values))
    if tables:
        rng = np.random.default_rng([cfg["seed"], len(run_id)])
        arrival = np.sort(rng.uniform(0, 10, n_requests))
        ttft = rng.lognormal(-1.0, 0.8, n_requests)
        e2e = ttft + rng.uniform(1, 5, n_requests)
        pd.DataFrame({
            "request_id": np.arange(n_requests), "arrival_s": arrival, "first_token_s": arrival + ttft,
            "finish_s": arrival + e2e, "prompt_tokens": rng.integers(100, 4000, n_requests),
            "output_tokens": rng.integers(10, 1000, n_requests), "reused_tokens": 0,
            "initial_input_tokens": 100, "recomputed_tokens": 0, "preemptions": 0,
            "j_adopt": 512, "r_max": 1024, "attn_depth": 1024, "status": "finished",
            "ttft_s": ttft, "e2e_s": e2e, "itl_mean_s": rng.uniform(0.01, 0.05, n_requests),
            "itl_p99_s": 0.1, "tpot_s": 0.03,
        }).to_parquet(d / "requests.parquet")
        t = np.linspace(0, 12, 40)
        pd.DataFrame({
            "time_s": t, "running": 4, "waiting": 1, "batch_tokens": 512,
            "mem_attention_bytes": (1 + np.sin(t)) * 2**30, "mem_ssm_bytes": np.full(t.size, 3 * 2**30),
            "mem_conv_bytes": np.full(t.size, 0.1 * 2**30),
        }).to_parquet(d / "steps.parquet")
    (d / "manifest.json").write_text(json.dumps(manifest))
    return record_files(d)


def run_id_of(run_dir: Path) -> str:
    """The run id `write_run` recorded for the directory ``run_dir`` (what reports name it by)."""
    return json.loads((Path(run_dir) / "manifest.json").read_text())["run_id"]


def readdress(run_dir: Path, **changes) -> Path:
    """``run_dir`` as a run written with ``changes`` in its manifest would be:
    the changes made, the run id recomputed (`harness.run_address.address_of`)
    and the directory renamed to it when it was named by it."""
    run_dir = Path(run_dir)
    manifest = {**json.loads((run_dir / "manifest.json").read_text()), **changes}
    old, manifest["run_id"] = manifest["run_id"], address_of(manifest)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    if run_dir.name == old:
        run_dir = run_dir.rename(run_dir.parent / manifest["run_id"])
    return record_files(run_dir)


def record_files(run_dir: Path) -> Path:
    """Record in ``run_dir``'s manifest the size and sha256 of the files it holds
    now (the rest as dropped), and seal it, as a run written with them would: a test that
    means a run *with* other values, not a run damaged after it was written."""
    names = ("summary.json", "requests.parquet", "steps.parquet")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["files"] = {n: {"bytes": (run_dir / n).stat().st_size,
                             "sha256": hashlib.sha256((run_dir / n).read_bytes()).hexdigest()}
                         for n in names if (run_dir / n).is_file()}
    manifest["dropped_files"] = [n for n in names if n not in manifest["files"]]
    (run_dir / "manifest.json").write_text(json.dumps(sealed(manifest)))
    return run_dir


def write_design(path, text: str) -> Path:
    Path(path).write_text(text)
    return Path(path)
