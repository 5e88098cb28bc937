"""What vLLM's scheduler in process costs against the simulator, side by side.

One study-sized cell (Falcon-H1-7B, 240 requests at 3 req/s, b83, seed 1)
per organization, served by ``hbench run --engine sim --paging P`` and by
``hbench run --engine vllm`` (no server: vLLM's scheduler in process) in
fresh processes, rounds alternating which goes first, on the same workload
and the same layout (P is the layout the in-process run resolves:
``vllm-gpu`` for S0/D0, ``study`` for S1/S2). Per engine it reports the best
wall time, and for the in-process run the part spent building vLLM's
configuration (`adapters.vllm_inprocess.config.build`, timed alone in the
vLLM venv), which is paid once per run.

    HBENCH_VLLM_PYTHON=.venv-vllm/bin/python python -m benchmarks.bench_vllm_inprocess \\
        [--orgs s0,s2] [--rounds 2] [--requests 240]
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

from harness.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]

BUILD_ONLY = """
import time, tempfile, pickle, sys
from pathlib import Path
from adapters.vllm_inprocess.worker import quiet_vllm
quiet_vllm()
t0 = time.perf_counter()
from adapters.vllm_inprocess.config import build
t1 = time.perf_counter()
config, budget = pickle.loads(bytes.fromhex(sys.argv[1]))
with tempfile.TemporaryDirectory() as tmp:
    build(config, budget, Path(tmp))
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


def run_once(engine: str, org: str, paging: str, requests: int, out: Path) -> tuple[float, dict]:
    """Wall seconds of one ``hbench run`` in a fresh process, and its summary."""
    args = [sys.executable, "-m", "hbench.cli", "run", "--engine", engine, "--org", org,
            "--budget", "b83", "--requests", str(requests), "--seed", "1", "--out", str(out),
            "--json"]
    if engine == "sim":
        args += ["--paging", paging]
    t0 = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    doc = json.loads(done.stdout)
    return wall, doc.get("summary", doc)


def build_seconds(org: str, python: str) -> tuple[float, float]:
    """(import, build) seconds of vLLM's configuration for the cell, alone."""
    import pickle

    from harness.run_setup import validate

    config = RunConfig(engine="vllm", org=org, budget="b83")
    payload = pickle.dumps((config, validate(config).budget.target_bytes)).hex()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HBENCH_ORG": ""}
    done = subprocess.run([python, "-c", BUILD_ONLY, payload], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    imp, build = done.stdout.split()[-2:]
    return float(imp), float(build)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orgs", default="s0,s2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=240)
    args = ap.parse_args(argv)
    python = os.environ.get("HBENCH_VLLM_PYTHON")
    if not python:
        sys.exit("set HBENCH_VLLM_PYTHON (scripts/setup_vllm_cpu.sh)")
    print(f"vLLM's scheduler in process against the simulator: {args.requests} requests, b83, "
          f"best of {args.rounds} alternating rounds; load average {os.getloadavg()[0]:.1f}")
    print(f"{'org':4} {'paging':9} {'sim s':>7} {'vllm s':>7} {'ratio':>6} {'import s':>9} "
          f"{'build s':>8}  output tok/s sim / vllm")
    with tempfile.TemporaryDirectory() as tmp:
        for org in args.orgs.split(","):
            paging = RunConfig(engine="vllm", org=org).resolved_paging
            best = {"sim": float("inf"), "vllm": float("inf")}
            tput = {}
            for rnd in range(args.rounds):
                order = ("sim", "vllm") if rnd % 2 == 0 else ("vllm", "sim")
                for engine in order:
                    wall, summary = run_once(engine, org, paging, args.requests,
                                             Path(tmp) / f"{engine}-{org}-{rnd}")
                    best[engine] = min(best[engine], wall)
                    tput[engine] = summary["throughput_ledger_tok_s"]
            imp, build = build_seconds(org, python)
            print(f"{org:4} {paging:9} {best['sim']:7.2f} {best['vllm']:7.2f} "
                  f"{best['vllm'] / best['sim']:6.1f} {imp:9.2f} {build:8.2f}  "
                  f"{tput['sim']:.0f} / {tput['vllm']:.0f}")


if __name__ == "__main__":
    main()
