"""What a whole `hbench run` process costs, against the import floor.

Per size (``--sizes``, requests at ``--rate`` req/s, S2 at b83 on the
simulator): the wall time of a fresh ``python -m hbench.cli run`` process,
the floor ``python -c "import numpy, pyarrow"``, and, from a second fresh
process that does what ``hbench run`` does with a clock between the steps,
its phases: imports (interpreter start included), setup (config checks,
engine and its version), workload build, engine, writing (summary and
tables), and that process's peak RSS. Repeats are interleaved (floor, run,
phases, then again) and medians reported.

    python -m benchmarks.bench_process [--sizes 240,10000] [--repeats 5] [--rate 3]
        [--against TREE]

``--against TREE`` runs everything alternately in TREE (another checkout,
e.g. ``git worktree add /tmp/base COMMIT``) and in this one, and prints both
side by side with this checkout's median over TREE's.
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

from benchmarks.bench_scale import PHASE_SCRIPT

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("imports", "setup", "workload", "engine", "writing")

# The phase script that runs in the tree under test: `benchmarks.bench_scale`'s
# (S2 here): it needs only what every tree since the phases were first timed has.


def _env(tree: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree))


def _wall(cmd: list[str], tree: Path) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=tree, env=_env(tree), check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def measure(tree: Path, requests: int, rate: float, tmp: Path) -> dict:
    """One interleaved round in ``tree``: floor, whole run, phases."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    floor = _wall([sys.executable, "-c", "import numpy, pyarrow"], tree)
    whole = _wall([sys.executable, "-m", "hbench.cli", "run", "--org", "s2", "--budget", "b83",
                   "--rate", str(rate), "--requests", str(requests), "--seed", "1",
                   "--out", str(out / "run"), "--json"], tree)
    phases = subprocess.run([sys.executable, "-c", PHASE_SCRIPT, "s2", str(requests), str(rate),
                             str(out / "phases"), repr(time.time())],
                            cwd=tree, env=_env(tree), check=True, capture_output=True, text=True)
    return {"floor": floor, "whole": whole, **json.loads(phases.stdout.strip().splitlines()[-1])}


KEYS = ("floor", "whole", "ratio", *PHASES, "peak_rss_mib")


def medians(rounds: list[dict]) -> dict:
    out = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    out["ratio"] = statistics.median(r["whole"] / r["floor"] for r in rounds)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="240,10000", help="request counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--against", type=Path, default=None, help="another checkout to compare with")
    args = ap.parse_args(argv)
    trees = {"this": ROOT} if args.against is None else {"base": args.against.resolve(), "this": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        for requests in (int(s) for s in args.sizes.split(",")):
            rounds: dict[str, list[dict]] = {name: [] for name in trees}
            for i in range(args.repeats):
                order = list(trees) if i % 2 == 0 else list(reversed(trees))
                for name in order:
                    rounds[name].append(measure(trees[name], requests, args.rate, Path(tmp)))
            med = {name: medians(r) for name, r in rounds.items()}
            print(f"\n{requests} requests at {args.rate:g} req/s, S2 b83 sim, "
                  f"medians of {args.repeats} interleaved repeats (s; RSS MiB)")
            print(f"{'':14}" + "".join(f"{n:>10}" for n in trees)
                  + (f"{'this/base':>11}" if len(trees) == 2 else ""))
            for k in KEYS:
                row = f"{k:14}" + "".join(f"{med[n][k]:10.3f}" for n in trees)
                if len(trees) == 2 and med["base"][k]:
                    row += f"{med['this'][k] / med['base'][k]:11.2f}"
                print(row)


if __name__ == "__main__":
    main()
