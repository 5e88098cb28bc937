"""Wall time of the study-sized simulated run, per organization, on one core.

For each organization: the workload build (the first one in the process also
loads the packaged ShareGPT data from its disk cache; later ones reuse it) and
`SimEngine.run` alone, then simulated requests per wall-second. With
``--profile ORG`` one more run of that organization goes under cProfile and
the top functions by cumulative and by own time are listed as a share of
the profiled `SimEngine.run`.

    python -m benchmarks.bench_run [--orgs s0,s1,s2,d0] [--requests 240] [--rate 3]
        [--workload-kind multiturn] [--repeats 1] [--cpu 0] [--profile s2] [--top 20] [--json out.json]
        [--against TREE [--rounds 3] [--cpu-time]] [--rss 1000,4000] [--scale 1000,16000]

``--against TREE`` compares two versions of the code: it runs this benchmark
alternately in TREE (another checkout, e.g. made with ``git worktree add``)
and in this checkout, ``--rounds`` times each (which goes first alternates),
and reports per organization the best ``SimEngine.run`` time of each and this
checkout's over TREE's (``--cpu-time``: the process's CPU time, steadier
than wall time on a loaded machine). ``--rss N,M`` runs one simulated run of N (then M)
requests of the first organization in a fresh process each and reports the
process's peak resident set size (``ru_maxrss``), whole process included.
``--scale N,M`` asks whether a request costs the same in a long run as in a
short one: one run of N (then M) requests of each organization in a fresh
process each, its `SimEngine.run` CPU time per request, that over the first
count's, and the CPU time of each ``--segment`` requests that end (from the
engine's progress count), so a cost that grows as the run goes on shows as
later segments costing more than earlier ones.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import json
import pstats
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from adapters.sim.engine import SimEngine
from benchmarks.bench_orgs import pin_cpu
from harness.config import ORG_NAMES, RunConfig
from harness.run_setup import RunSetup
from harness.run_workload import build_run_workload

ROOT = Path(__file__).resolve().parents[1]


def config_for(org: str, args) -> RunConfig:
    return dataclasses.replace(RunConfig(), org=org, budget=args.budget, requests=args.requests,
                               rate=args.rate, seed=args.seed,
                               workload_kind=args.workload_kind)


def time_org(org: str, args) -> dict:
    config = config_for(org, args)
    builds, runs, cpus = [], [], []
    run = None
    for _ in range(args.repeats):
        t = time.perf_counter()
        workload = build_run_workload(config)
        builds.append(time.perf_counter() - t)
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        run = SimEngine().run(workload, RunSetup.resolve(config))
        runs.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    best = min(runs)
    return {"build_s": builds, "run_s": runs, "best_run_s": best, "best_cpu_s": min(cpus),
            "median_run_s": statistics.median(runs), "steps": len(run.steps),
            "simulated_s": run.window_end_s, "preemptions": run.counters["preemptions"],
            "requests_per_wall_s": len(run.requests) / best}


def _where(func: tuple) -> str:
    file, line, name = func
    try:
        file = str(Path(file).resolve().relative_to(ROOT))
    except ValueError:
        file = Path(file).name
    return f"{file}:{line}({name})" if line else name


def profile(org: str, args) -> dict:
    config = config_for(org, args)
    workload = build_run_workload(config)
    prof = cProfile.Profile()
    t = time.perf_counter()
    setup = RunSetup.resolve(config)
    prof.runcall(SimEngine().run, workload, setup)
    wall = time.perf_counter() - t
    st = pstats.Stats(prof)
    rows = [(func, tt, ct, nc) for func, (_, nc, tt, ct, _) in st.stats.items()]
    total = max(ct for _, _, ct, _ in rows)      # SimEngine.run's own cumulative time
    out = {"wall_s_under_profiler": wall, "profiled_s": total}
    for key, col in (("cumulative", 2), ("own", 1)):
        top = sorted(rows, key=lambda r: r[col], reverse=True)[:args.top]
        out[key] = [{"function": _where(f), "calls": nc, "own_pct": 100 * tt / total,
                     "cum_pct": 100 * ct / total} for f, tt, ct, nc in top]
    return out


def against(args, orgs: list[str]) -> int:
    """Best run time per organization here and in ``args.against``, alternating."""
    from benchmarks.side_by_side import alternate

    alternate(args.against, "benchmarks.bench_run",
              ["--orgs", ",".join(orgs), "--requests", str(args.requests), "--rate",
               str(args.rate), "--budget", args.budget, "--seed", str(args.seed),
               "--workload-kind", args.workload_kind, "--repeats", str(args.repeats),
               "--cpu", str(args.cpu)],
              orgs, "best_cpu_s" if args.cpu_time else "best_run_s", args.rounds,
              f"SimEngine.run {'CPU' if args.cpu_time else 'wall'} time "
              f"({args.repeats} repeats each)", args.json)
    return 0


def peak_rss(args, org: str) -> int:
    """One run in this process; the process's peak RSS in bytes afterwards."""
    config = config_for(org, args)
    SimEngine().run(build_run_workload(config), RunSetup.resolve(config))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB


def rss(args, org: str) -> int:
    """Peak RSS of one fresh process per request count in ``args.rss``."""
    print(f"peak RSS of one {org} run per process, {args.rate:g} req/s, budget {args.budget}")
    print(f"{'requests':>8} {'peak RSS MB':>11} {'MB / 1000 req':>13}")
    result = {}
    for n in (int(x) for x in args.rss.split(",")):
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_run", "--orgs", org,
                              "--requests", str(n), "--rate", str(args.rate), "--budget",
                              args.budget, "--seed", str(args.seed), "--cpu", str(args.cpu),
                              "--rss-child"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout
        b = int(out.split()[-1])
        result[n] = b
        print(f"{n:8d} {b / 1e6:11.1f} {b / 1e6 / n * 1000:13.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"org": org, "peak_rss_bytes": result}, indent=2))
    return 0


def scale_child(args, org: str) -> dict:
    """One run in this process: its engine CPU time and that of each segment."""
    config = config_for(org, args)
    workload = build_run_workload(config)
    setup = RunSetup.resolve(config)
    gc.collect()
    marks = []

    def progress(ended: int) -> None:
        if ended % args.segment == 0:
            marks.append(time.process_time())

    t = time.process_time()
    SimEngine().run(workload, setup, progress)
    cpu = time.process_time() - t
    return {"cpu_s": cpu, "segments_s": [b - a for a, b in zip([t, *marks[:-1]], marks, strict=True)]}


def scale(args, orgs: list[str]) -> int:
    """Engine CPU time per request at each request count of ``args.scale``."""
    counts = [int(x) for x in args.scale.split(",")]
    print(f"SimEngine.run CPU time per request, {args.rate:g} req/s, budget {args.budget}, "
          f"seed {args.seed}, one fresh process per run; segments of {args.segment} ended requests")
    print(f"{'org':4} {'requests':>8} {'CPU s':>7} {'ms/req':>7} {'x first':>7} "
          f"{'segment ms/req: first':>21} {'min':>6} {'max':>6} {'last':>6}")
    result = {}
    for org in orgs:
        first = None
        for n in counts:
            out = subprocess.run([sys.executable, "-m", "benchmarks.bench_run", "--orgs", org,
                                  "--requests", str(n), "--rate", str(args.rate), "--budget",
                                  args.budget, "--seed", str(args.seed), "--cpu", str(args.cpu),
                                  "--segment", str(args.segment), "--scale-child"],
                                 cwd=ROOT, check=True, capture_output=True, text=True).stdout
            r = result.setdefault(org, {})[n] = json.loads(out.splitlines()[-1])
            per = r["cpu_s"] / n * 1e3
            first = first or per
            seg = [s / args.segment * 1e3 for s in r["segments_s"]] or [per]
            print(f"{org:4} {n:8d} {r['cpu_s']:7.2f} {per:7.3f} {per / first:7.2f} "
                  f"{seg[0]:21.3f} {min(seg):6.3f} {max(seg):6.3f} {seg[-1]:6.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orgs", default=",".join(ORG_NAMES))
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--budget", default="b83")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload-kind", default="sharegpt", help="sharegpt or multiturn (chat)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cpu", type=int, default=0, help="pin to this CPU (-1: do not pin)")
    ap.add_argument("--profile", choices=ORG_NAMES, help="also profile one run of this org")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--against", help="compare with the checkout at this path (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="with --against: runs per checkout")
    ap.add_argument("--cpu-time", action="store_true",
                    help="with --against: compare process CPU time, not wall time")
    ap.add_argument("--rss", help="peak RSS of one run per request count, e.g. 1000,4000")
    ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scale", help="engine CPU time per request per request count, e.g. 1000,16000")
    ap.add_argument("--segment", type=int, default=1000, help="with --scale: requests per segment")
    ap.add_argument("--scale-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    orgs = [o.strip() for o in args.orgs.split(",")]
    if args.rss_child:
        print(peak_rss(args, orgs[0]))
        return 0
    if args.scale_child:
        pin_cpu(args.cpu)
        print(json.dumps(scale_child(args, orgs[0])))
        return 0
    if args.against:
        return against(args, orgs)
    if args.scale:
        return scale(args, orgs)
    if args.rss:
        return rss(args, orgs[0])

    pinned = pin_cpu(args.cpu)
    print(f"{args.requests} requests at {args.rate:g} req/s, budget {args.budget}, seed "
          f"{args.seed}; {pinned}; best of {args.repeats}")
    print(f"{'org':4} {'build s':>8} {'run s':>7} {'median':>7} {'req/wall-s':>10} "
          f"{'steps':>6} {'sim s':>7} {'preempt':>7}")
    result = {"requests": args.requests, "rate": args.rate, "budget": args.budget,
              "cpu": pinned, "orgs": {}}
    for o in orgs:
        r = result["orgs"][o] = time_org(o, args)
        print(f"{o:4} {r['build_s'][0]:8.3f} {r['best_run_s']:7.3f} {r['median_run_s']:7.3f} "
              f"{r['requests_per_wall_s']:10.1f} {r['steps']:6d} {r['simulated_s']:7.1f} "
              f"{r['preemptions']:7d}")
    if args.profile:
        p = result["profile"] = {"org": args.profile, **profile(args.profile, args)}
        print(f"\ncProfile of one {args.profile} run: {p['wall_s_under_profiler']:.2f} s wall "
              f"under the profiler")
        for key in ("cumulative", "own"):
            print(f"top {args.top} by {key} time (% of the profiled SimEngine.run)")
            print(f"  {'cum %':>6} {'own %':>6} {'calls':>9}  function")
            for row in p[key]:
                print(f"  {row['cum_pct']:6.1f} {row['own_pct']:6.1f} {row['calls']:9d}  "
                      f"{row['function']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
