"""Time building a 1,000-request workload from the packaged ShareGPT V3.

Three figures, each the wall time of `build_workload(seed, q=1, rate=3,
requests=1000)`:
  cold      fresh process, empty cache dir: parse JSON + write cache + derive
  warm disk fresh process, cache present: read Parquet cache + derive
  in-process  same process again, another seed (what a sweep pays per cell)
plus q=0 (1,000 private contexts) in the warm process. Fresh processes are
real subprocesses so no in-process memo leaks into the cold figures.

    python benchmarks/bench_workload.py [--requests 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _phase(requests: int) -> dict:
    from workloads.build import build_workload

    out = {}
    t = time.perf_counter()
    w = build_workload(seed=1, q=1.0, rate=3.0, requests=requests)
    out["first_build_s"] = time.perf_counter() - t
    t = time.perf_counter()
    build_workload(seed=2, q=1.0, rate=3.0, requests=requests)
    out["in_process_s"] = time.perf_counter() - t
    t = time.perf_counter()
    build_workload(seed=3, q=0.0, rate=3.0, requests=requests)
    out["in_process_q0_s"] = time.perf_counter() - t
    out["mean_input_tokens"] = w.meta["mean_input_tokens"]
    out["records_read"] = w.meta["records_read"]
    return out


def _run_phase(requests: int, cache: str) -> dict:
    env = dict(os.environ, HBENCH_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, __file__, "--phase", "--requests", str(requests)],
                         env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(_phase(args.requests)))
        return
    with tempfile.TemporaryDirectory() as cache:
        cold = _run_phase(args.requests, cache)
        warm = _run_phase(args.requests, cache)
    n = args.requests
    print(f"{n}-request workload from the packaged ShareGPT V3 "
          f"({cold['records_read']} records, mean input {cold['mean_input_tokens']:.0f} tokens)")
    print(f"  cold (parse + cache write + derive)   {cold['first_build_s']:6.2f} s")
    print(f"  warm disk cache (read + derive)       {warm['first_build_s']:6.2f} s")
    print(f"  in-process, new seed, q=1             {warm['in_process_s']:6.2f} s")
    print(f"  in-process, new seed, q=0             {warm['in_process_q0_s']:6.2f} s")


if __name__ == "__main__":
    main()
