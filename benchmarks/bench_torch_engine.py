"""The torch engine: what paged state costs a decode step, and whole runs per organization.

Two measurements on the proportional tiny model (random weights, float32,
one intra-op thread):

1. ``decode``: one decode step of ``--batch`` requests at ``--context``
   tokens, side by side in one process, alternating ``--repeats`` times:
   *gathered* (each request's SSM + conv state copied out of its pages as S2
   lays it out - 3 SSM member pages and a 1/16 slot of a slab page - the step,
   then scattered back) against *contiguous* (the states already in one
   batched tensor, updated in place). K/V are paged in both. Prints the
   medians and their ratio.
2. ``runs``: ``hbench run --engine torch`` at the tiny working point
   (``--requests`` requests, shared prefixes, open loop at ``--rate``) once
   per organization at ``--budget``: wall time, throughput, TTFT/ITL and the
   memory-pressure counters.

    python -m benchmarks.bench_torch_engine [--part decode|runs|both] [--batch 8]
        [--context 1024] [--repeats 15] [--requests 60] [--rate 4] [--budget b8]
        [--mean-input 1000] [--orgs s0,s1,s2,d0]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from adapters.tiny_model import PRESETS, write_weights
from adapters.torch.model import FalconH1
from adapters.torch.paging import (
    Extent,
    StatePlacement,
    gather_state,
    kv_view,
    lay_over_pages,
    scatter_state,
)
from harness.config import ORG_NAMES

#: The tiny working point (`docs/engines.md`): ~1000-token prompts over four
#: shared contexts, 32 output tokens, open-loop Poisson arrivals.
WORKING_POINT = dict(mean_input=1000, max_output=32, contexts=4, max_model_len=4096, seed=0)


def decode_cost(model: FalconH1, batch: int, context: int, repeats: int) -> dict:
    sh = model.shapes
    page = sh.kv_block_elems(512)                     # S2's page: one 512-token K/V block
    ssm_pages = -(-sh.ssm_elems // page)
    blocks = -(-(context + 1) // 512)
    slab_slot = page // 16
    pool = torch.zeros(batch * (blocks + ssm_pages) + 1, sh.n_layers, page)
    kv = kv_view(pool, sh, 512)
    tables, places, nxt = [], [], 0
    slab = pool.shape[0] - 1
    for r in range(batch):
        tables.append(list(range(nxt, nxt + blocks)))
        nxt += blocks
        ssm = lay_over_pages(list(range(nxt, nxt + ssm_pages)), sh.ssm_elems, page)
        nxt += ssm_pages
        places.append(StatePlacement(ssm, (Extent(slab, r * slab_slot, sh.conv_elems),)))
    g = torch.Generator().manual_seed(0)
    pool.normal_(0, 0.1, generator=g)
    tokens = torch.randint(0, model.cfg.vocab_size, (batch,), generator=g)
    positions = torch.full((batch,), context, dtype=torch.long)
    ssm_b, conv_b = (t * 0.0 for t in sh.zero_state(batch))

    def gathered() -> None:
        states = [gather_state(pool, p, sh) for p in places]
        ssm = torch.stack([s for s, _ in states])
        conv = torch.stack([c for _, c in states])
        model.decode(tokens, positions, kv, tables, ssm, conv)
        for k, p in enumerate(places):
            scatter_state(pool, p, ssm[k], conv[k])

    def contiguous() -> None:
        model.decode(tokens, positions, kv, tables, ssm_b, conv_b)

    times = {"gathered": [], "contiguous": []}
    for fn in (gathered, contiguous):
        fn()                                          # warm-up
    for _ in range(repeats):
        for name, fn in (("gathered", gathered), ("contiguous", contiguous)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {**{f"{k}_ms": 1e3 * v for k, v in med.items()},
            "ratio": med["gathered"] / med["contiguous"]}


def runs(model_dir: Path, orgs: list[str], requests: int, rate: float, budget: str,
         mean_input: int) -> dict:
    from adapters.torch.engine import TorchEngine
    from harness.config import RunConfig
    from harness.metrics import summarize
    from harness.run_setup import validate
    from harness.run_workload import build_run_workload

    out = {}
    for org in orgs:
        config = RunConfig(engine="torch", org=org, budget=budget, model=str(model_dir),
                           config_path=str(model_dir / "config.json"), requests=requests,
                           rate=rate, **(WORKING_POINT | {"mean_input": mean_input}))
        setup = validate(config)
        workload = build_run_workload(config)
        t = time.perf_counter()
        run = TorchEngine().run(workload, setup)
        wall = time.perf_counter() - t
        s = summarize(run)
        out[org] = {"wall_s": wall, "tok_s": s["throughput_span_tok_s"],
                    "ttft_p50_s": s["ttft_p50_s"], "itl_p50_ms": 1e3 * s["itl_p50_s"],
                    "waiting_median": s["waiting_median"], "preemptions": s["preemptions"],
                    "inval_attn": s["invalidations_attention"],
                    "inval_ckpt": s["invalidations_checkpoint"],
                    "reused": s["reused_tokens"], "steps": len(run.steps)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["decode", "runs", "both"], default="both")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--budget", default="b8")
    ap.add_argument("--mean-input", type=int, default=WORKING_POINT["mean_input"])
    ap.add_argument("--orgs", default=",".join(ORG_NAMES))   # what the torch engine serves: all
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_weights(d, PRESETS["proportional"], 512, seed=0)
        if a.part in ("decode", "both"):
            model = FalconH1.from_dir(d)
            r = decode_cost(model, a.batch, a.context, a.repeats)
            print(f"decode step, batch {a.batch} at {a.context} tokens (median of {a.repeats}): "
                  f"gathered {r['gathered_ms']:.2f} ms, contiguous {r['contiguous_ms']:.2f} ms, "
                  f"ratio {r['ratio']:.3f}")
        if a.part in ("runs", "both"):
            rows = runs(d, a.orgs.split(","), a.requests, a.rate, a.budget, a.mean_input)
            cols = list(next(iter(rows.values())))
            print("| org | " + " | ".join(cols) + " |")
            print("|---" * (len(cols) + 1) + "|")
            for org, r in rows.items():
                print(f"| {org} | " + " | ".join(
                    f"{v:.2f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")


if __name__ == "__main__":
    main()
