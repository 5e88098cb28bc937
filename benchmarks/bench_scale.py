"""What a run costs as it grows: process, engine, writing and memory per size.

For each size (``--sizes``, requests at ``--rate`` req/s on the simulator,
budget b83) and organization (``--orgs``), in one sitting: the import floor
``python -c "import numpy, pyarrow"``, and one fresh process that does what
``hbench run`` does (the same checks, workload, engine and results
directory) with a clock between its phases: whole (spawn to exit, against
the floor), workload build, engine (and its time per request against the
10,000-request run's, where the sizes include 10,000; also as the process's
CPU time, which other work on the cores inflates far less than wall time),
writing (summary and
tables), the process's RSS after the workload and after the engine
(``/proc/self/status``) and its peak RSS, and whether the run is valid
(``valid`` 1 or 0, the summary's verdict; an overloaded run's waiting queue
grows, and with it the memory of the prompts it holds). A size the input
checks refuse (the memory estimate) prints the refusal instead.

    python -m benchmarks.bench_scale [--sizes 240,10000,100000,1000000]
        [--orgs s2] [--rate 3] [--repeats 1]

A million requests takes tens of minutes per organization on a 2-core
machine; `docs/benchmarks.md` has the latest figures and
`docs/journal/benchmarks-2026.md` every sitting and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# argv: org, requests, rate, out, spawned (time.time() at spawn). Prints one JSON line.
PHASE_SCRIPT = r"""
import json, resource, sys, time
org, requests, rate, out, spawned = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], float(sys.argv[5])
def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
import hbench.cli, hbench.commands.run
from pathlib import Path
from adapters.registry import make_engine
from common.errors import HbenchError
from harness.config import RunConfig
from harness.results import write_run
try:
    from harness.run_address import new_run_id
except ImportError:      # a tree from before run ids had their own module
    from harness.results import new_run_id
from harness.run_workload import build_run_workload, recorded_config
from hbench.runner import budget_manifest, validate_run
t = [time.time()]
config = RunConfig(org=org, budget="b83", rate=rate, requests=requests, seed=1)
try:
    setup = validate_run(config)
except HbenchError as exc:
    print(json.dumps({"refused": str(exc)}))
    sys.exit(0)
engine = make_engine("sim")
version = engine.version()
t.append(time.time())
workload = build_run_workload(config)
t.append(time.time())
rss = [rss_mib()]
config = recorded_config(config, workload)
setup = setup.with_config(config)
cpu = time.process_time()
run = engine.run(workload, setup, None)
t.append(time.time())
cpu = time.process_time() - cpu
rss.append(rss_mib())
run_dir = write_run(Path(out), run_id=new_run_id(config, workload.content_hash), config=config, run=run,
          workload_hash=workload.content_hash, workload_meta=dict(workload.meta),
          budget=budget_manifest(setup.budget), engine_name=engine.name, engine_version=version,
          weights_bytes=setup.geometry.weights_bytes,
          extra_manifest={"cache_state": "cold", "warmup_requests": 0})
t.append(time.time())
valid = json.loads((run_dir / "summary.json").read_text())["validity"]
print(json.dumps({"valid": float(valid["valid"]), "why": valid["reasons"], "imports": t[0] - spawned, "setup": t[1] - t[0], "workload": t[2] - t[1],
                  "engine": t[3] - t[2], "engine_cpu": cpu, "writing": t[4] - t[3],
                  "rss_workload_mib": rss[0], "rss_engine_mib": rss[1],
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

COLUMNS = ("floor", "whole", "whole/floor", "workload", "engine", "ms/req", "vs 10k",
           "cpu ms/req", "cpu vs 10k", "writing", "MiB wl", "MiB eng", "peak MiB", "valid")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def floor() -> float:
    """Wall seconds of ``python -c "import numpy, pyarrow"``."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import numpy, pyarrow"], check=True, env=_env())
    return time.perf_counter() - t


def one_run(org: str, requests: int, rate: float, tmp: Path) -> dict:
    """One fresh process serving ``requests`` on ``org``: its phases, its wall
    time (``whole``), or ``refused`` with the input checks' message."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PHASE_SCRIPT, org, str(requests), str(rate),
                           str(out), repr(time.time())],
                          cwd=ROOT, env=_env(), check=True, capture_output=True, text=True)
    whole = time.perf_counter() - t
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "refused" not in result:
        result["whole"] = whole
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="240,10000,100000,1000000",
                    help="request counts, comma-separated")
    ap.add_argument("--orgs", default="s2", help="organizations, comma-separated")
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=1, help="runs per size (medians)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"sim, b83, {args.rate:g} req/s, seed 1; medians of {args.repeats}; seconds, MiB; "
          f"load average at start {os.getloadavg()[0]:.1f}")
    print(f"{'org':4}{'requests':>10}" + "".join(f"{c:>12}" for c in COLUMNS))
    with tempfile.TemporaryDirectory() as tmp:
        for org in args.orgs.split(","):
            per_request_10k = None
            for n in sizes:
                rounds = []
                for _ in range(args.repeats):
                    f = floor()
                    rounds.append({**one_run(org, n, args.rate, Path(tmp)), "floor": f})
                refused = [r["refused"] for r in rounds if "refused" in r]
                if refused:
                    print(f"{org:4}{n:>10}  refused: {refused[0]}")
                    continue
                why = sorted({w for r in rounds for w in r.pop("why")})
                med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
                med["whole/floor"] = statistics.median(r["whole"] / r["floor"] for r in rounds)
                med["ms/req"] = med["engine"] / n * 1e3
                med["peak MiB"] = med["peak_rss_mib"]
                med["MiB wl"], med["MiB eng"] = med["rss_workload_mib"], med["rss_engine_mib"]
                med["cpu ms/req"] = med["engine_cpu"] / n * 1e3
                if n == 10_000:
                    per_request_10k = (med["ms/req"], med["cpu ms/req"])
                med["vs 10k"], med["cpu vs 10k"] = (
                    (med["ms/req"] / per_request_10k[0], med["cpu ms/req"] / per_request_10k[1])
                    if per_request_10k else (float("nan"),) * 2)
                print(f"{org:4}{n:>10}" + "".join(f"{med[c]:12.3f}" for c in COLUMNS)
                      + (f"  ({', '.join(why)})" if why else ""), flush=True)


if __name__ == "__main__":
    main()
