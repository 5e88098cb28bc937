"""What a repeated study-sized `hbench run` spends beyond the import floor, part by part.

Each repeat is a fresh interpreter that times, one after the other: ``import
numpy, pyarrow`` (the floor's imports), click, ``pyarrow.parquet``, hbench's
own modules a run imports (and how much of that is making dataclasses), the
installed packages' versions and the git commit the manifest records, the
whole ``hbench run`` command through the ``hbench`` entry point (`main`),
and the process's exit (from `main`'s return to the end the parent sees).
Medians in milliseconds. Run each tree's caches warm first (two runs).

    python -m benchmarks.bench_run_parts [--repeats 9] [--tree TREE]

``--tree`` measures another checkout (its own tree as ``PYTHONPATH``).
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

PROBE = r"""
import dataclasses, json, sys, time
T = {}
t = time.perf_counter(); import numpy, pyarrow; T["import numpy, pyarrow"] = time.perf_counter() - t
made = [0.0]
process_class = dataclasses._process_class
def timed(*args, **kwargs):
    s = time.perf_counter(); cls = process_class(*args, **kwargs); made[0] += time.perf_counter() - s
    return cls
dataclasses._process_class = timed
t = time.perf_counter(); import click; T["import click"] = time.perf_counter() - t
t = time.perf_counter(); import pyarrow.parquet; T["import pyarrow.parquet"] = time.perf_counter() - t
t = time.perf_counter()
import hbench.cli, hbench.commands.run, hbench.runner, harness.results, harness.run_workload
import harness.engine.loop, harness.validity, adapters.sim.engine, adapters.sim.executor, workloads.build
T["import hbench's modules"] = time.perf_counter() - t
T["  of which making dataclasses"] = made[0]
from pathlib import Path
from harness import provenance
t = time.perf_counter(); provenance.package_versions(); T["package versions"] = time.perf_counter() - t
t = time.perf_counter(); provenance.git_commit(Path(provenance.__file__).parent)
T["git commit"] = time.perf_counter() - t
sys.argv = ["hbench", "run", "--org", "s2", "--budget", "b83", "--rate", "3", "--requests", "240",
            "--seed", "1", "--json", "--out", sys.argv[1]]
t = time.perf_counter()
try:
    hbench.cli.main()
except SystemExit:
    pass
T["the run command"] = time.perf_counter() - t
sys.stdout.flush()
print(json.dumps(T), file=sys.stderr)
print(repr(time.time()), file=sys.stderr)
"""


def one(tree: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(out)], cwd=tree, check=True,
                          env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True)
    ended = time.time()
    *_, parts, returned = proc.stderr.strip().splitlines()
    return {**json.loads(parts), "exit": ended - float(returned)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rounds = [one(args.tree.resolve(), Path(tmp) / str(i)) for i in range(args.repeats)]
    print(f"{args.tree}: medians of {args.repeats} fresh processes (ms)")
    for key in rounds[0]:
        print(f"{key:32}{1e3 * statistics.median(r[key] for r in rounds):8.1f}")


if __name__ == "__main__":
    main()
