"""Operations per second of each organization on one recorded operation trace.

Records the organization calls of a busy simulated run once (cached under
``$HBENCH_CACHE_DIR``, default ``~/.cache/hbench``, keyed by the simulator's
source digest so a code change re-records), then replays that same logical
trace through S0, S1, S2 and D0 side by side in this one process, several
rounds in rotating order, and reports each organization's speed relative to
S0. See `benchmarks.org_trace` for how a replay stays honest when an
organization fits less than the recording one did.

``--against TREE`` compares two versions of the code instead: it runs this
benchmark on one trace alternately in TREE (another checkout, e.g. made with
``git worktree add``) and in this checkout, ``--rounds`` times each, and
reports per organization this checkout's best time over TREE's.

    python -m benchmarks.bench_orgs [--requests 80] [--rate 4.5] [--record-org s0]
        [--repeats 5] [--by-op] [--cpu 0] [--max-ratio 2.0] [--json out.json]
        [--against TREE [--rounds 3]]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

from adapters.sim.engine import SimEngine
from benchmarks.org_trace import (
    OP_NAMES,
    Trace,
    build_org,
    describe,
    record_trace,
    replay,
    trace_config,
)
from harness.config import ORG_NAMES
from workloads.sharegpt.loader import cache_dir


def pin_cpu(cpu: int) -> str:
    """Run on one core (``cpu`` < 0: leave the affinity alone)."""
    if cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    return "not pinned"


def trace_path(args) -> Path:
    version = SimEngine().version()
    return cache_dir() / (f"org-trace-{args.record_org}-{args.budget}-{args.requests}r-"
                          f"{args.rate:g}rps-seed{args.seed}-{version}.npz")


def load_or_record(args) -> tuple[Trace, str]:
    path = Path(args.trace) if args.trace else trace_path(args)
    if path.exists() and not args.rerecord:
        return Trace.load(path), f"loaded {path}"
    t = time.perf_counter()
    trace = record_trace(trace_config(args.requests, args.rate, args.record_org, args.budget,
                                      args.seed))
    took = time.perf_counter() - t
    trace.save(path)
    return trace, f"recorded in {took:.1f} s (simulated run + recording), saved {path} " \
                  f"({path.stat().st_size / 1e6:.1f} MB)"


def bench(trace: Trace, orgs: list[str], repeats: int) -> dict[str, list]:
    """``repeats`` rounds; each round replays every org once, the order rotated."""
    key_lists, rows = trace.key_lists(), trace.ops.tolist()
    runs: dict[str, list] = {o: [] for o in orgs}
    for rnd in range(repeats):
        for o in orgs[rnd % len(orgs):] + orgs[:rnd % len(orgs)]:
            org = build_org(o, trace)
            gc.collect()
            stats = replay(trace, org, key_lists=key_lists, rows=rows)
            org.check_invariants()
            runs[o].append(stats)
    return runs


def by_op(trace: Trace, orgs: list[str]) -> dict[str, dict]:
    key_lists, rows = trace.key_lists(), trace.ops.tolist()
    out = {}
    for o in orgs:
        org = build_org(o, trace)
        gc.collect()
        out[o] = replay(trace, org, by_op=True, key_lists=key_lists, rows=rows).seconds_by_op
    return out


def against(args, orgs: list[str], trace_file: Path) -> int:
    """Best replay time per organization, this checkout over ``args.against``'s,
    both replaying ``trace_file``; the two alternate, which goes first rotating."""
    from benchmarks.side_by_side import alternate

    alternate(args.against, "benchmarks.bench_orgs",
              ["--trace", str(trace_file), "--repeats", str(args.repeats), "--cpu",
               str(args.cpu), "--orgs", ",".join(orgs)],
              orgs, "best_s", args.rounds,
              f"organization trace replay ({args.repeats} rounds each)", args.json)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--rate", type=float, default=4.5)
    ap.add_argument("--budget", default="b83")
    ap.add_argument("--record-org", default="s0", choices=ORG_NAMES,
                    help="organization the trace is recorded on (the one that fits least)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--orgs", default=",".join(ORG_NAMES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--trace", help="replay this trace file instead of the cached one")
    ap.add_argument("--rerecord", action="store_true", help="record even if a cached trace exists")
    ap.add_argument("--by-op", action="store_true", help="also time each op kind (one extra pass)")
    ap.add_argument("--cpu", type=int, default=0, help="pin to this CPU (-1: do not pin)")
    ap.add_argument("--max-ratio", type=float, help="exit 1 if an org's time exceeds this x S0")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--against", help="compare with the checkout at this path (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="with --against: runs per checkout")
    args = ap.parse_args()
    orgs = [o.strip() for o in args.orgs.split(",")]
    if "s0" not in orgs:
        orgs.insert(0, "s0")

    if args.against:
        path = Path(args.trace) if args.trace else trace_path(args)
        if not path.exists() or args.rerecord:
            load_or_record(argparse.Namespace(**{**vars(args), "trace": str(path)}))
        return against(args, orgs, path)
    pinned = pin_cpu(args.cpu)
    trace, how = load_or_record(args)
    print(f"trace: {describe(trace)}")
    print(f"       {how}; {pinned}; best and median of {args.repeats} rounds")
    runs = bench(trace, orgs, args.repeats)
    base = min(s.seconds for s in runs["s0"])
    print(f"{'org':4} {'ops':>8} {'best s':>7} {'median s':>8} {'kops/s':>7} {'x S0':>5} "
          f"{'admitted':>8} {'refused':>7} {'forced':>6} {'skipped':>7}")
    result = {"trace": describe(trace), "repeats": args.repeats, "cpu": pinned, "orgs": {}}
    worst = 0.0
    for o in orgs:
        s = runs[o]
        best = min(x.seconds for x in s)
        med = statistics.median(x.seconds for x in s)
        ratio = best / base
        worst = max(worst, ratio)
        last = s[-1]
        print(f"{o:4} {last.ops:8d} {best:7.3f} {med:8.3f} {last.ops / best / 1e3:7.1f} "
              f"{ratio:5.2f} {last.admitted:8d} {last.refused:7d} {last.forced_preemptions:6d} "
              f"{last.skipped:7d}")
        result["orgs"][o] = {"ops": last.ops, "best_s": best, "median_s": med,
                             "ops_per_s": last.ops / best, "ratio_to_s0": ratio,
                             "admitted": last.admitted, "refused": last.refused,
                             "forced_preemptions": last.forced_preemptions,
                             "skipped": last.skipped, "finish_as_abandon": last.finish_as_abandon}
    if args.by_op:
        table = by_op(trace, orgs)
        kinds = [k for k in OP_NAMES if any(table[o][k] for o in orgs)]
        print("\nseconds by op kind (one instrumented pass; timer overhead included)")
        print(f"{'org':4} " + " ".join(f"{k:>12}" for k in kinds))
        for o in orgs:
            print(f"{o:4} " + " ".join(f"{table[o][k]:12.3f}" for k in kinds))
        result["seconds_by_op"] = table
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.max_ratio is not None and worst > args.max_ratio:
        print(f"slowest organization takes {worst:.2f}x S0's time (limit {args.max_ratio:g}x)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
