"""Time per call of the simulator's cost model (`CostModel.step`).

A study-sized run makes tens of thousands of `step()` calls, so each must
stay cheap. Times the call on a busy step (one 512-token prefill chunk after
1,024 cached tokens and 62 decodes at 3,000 tokens of context, one
checkpoint copy) at Falcon-H1-7B on the A100 preset, best of ``--repeats``
rounds of ``--calls`` calls, and prints it with the target: under 50 µs a
call (measured 2 to 9 µs, docs/cost-model.md). Exits 1 above the target
with ``--check``.

    python -m benchmarks.bench_cost [--calls 20000] [--repeats 5] [--cpu 0] [--check]
"""

from __future__ import annotations

import argparse
import sys
import time

from adapters.sim.cost import CostModel
from adapters.sim.hardware import get_hardware
from benchmarks.bench_orgs import pin_cpu
from harness.engine.shape import StepShape
from harness.model_configs import preset

TARGET_US = 50.0


def per_call_us(calls: int, repeats: int) -> float:
    """Best of ``repeats`` rounds: microseconds per `CostModel.step` call."""
    model = CostModel(preset("falcon-h1-7b"), get_hardware("a100-pcie-40gb"))
    shape = StepShape.from_requests(prefill_chunks=((512, 1024),), decode_contexts=(3000,) * 62,
                                    checkpoint_copies=1)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            model.step(shape)
        best = min(best, time.perf_counter() - t)
    return best / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=0, help="core to pin to (-1: don't pin)")
    ap.add_argument("--check", action="store_true", help=f"exit 1 above {TARGET_US:g} µs a call")
    args = ap.parse_args()
    pinned = pin_cpu(args.cpu)
    us = per_call_us(args.calls, args.repeats)
    verdict = "within" if us < TARGET_US else "ABOVE"
    print(f"CostModel.step: {us:.2f} µs per call (best of {args.repeats} x {args.calls:,} calls, "
          f"{pinned}); target < {TARGET_US:g} µs: {verdict}")
    if args.check and us >= TARGET_US:
        sys.exit(1)


if __name__ == "__main__":
    main()
