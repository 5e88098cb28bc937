"""Where a reproduction grid's engine time goes: its cells' steps and CPU time.

For each cell of one seed of a design's grid (``--design q6``: S2 and D0 at
five headrooms and three budgets), the simulator's CPU time (best of
``--repeats`` in-process runs, `time.process_time`), the run's steps, and
how many of them were quiet repeats (a stretch's decode step with the same
batch and no page taken or freed), fresh repeats (the same batch, but a
block was allocated or a request finished, so memory is read again) or
planned afresh (a step the scheduler planned, an admission or a preemption),
and the mean length of an unbroken sequence of quiet repeats (the most steps
that could be handled in bulk without taking or freeing a page).
A last line per organization and for the grid gives the means, so the
engine's share of a grid's CPU time per run can be read beside the grid's
own (``/usr/bin/time hbench reproduce q6 --jobs 2 --no-figures``).

    python -m benchmarks.bench_grid_cells [--design q6] [--seed-index 0] [--repeats 3] [--cpu 0]

The step kinds are counted in one more, untimed run per cell, through
wrappers on the step recorder's methods (`harness.engine.recorder`).
"""

from __future__ import annotations

import argparse
import collections
import gc
import itertools
import statistics
import time

from adapters.sim.engine import SimEngine
from analysis.designs import design
from benchmarks.bench_orgs import pin_cpu
from harness.engine import recorder
from harness.run_setup import RunSetup
from harness.run_workload import build_run_workload

#: Recorder methods by the kind of step they record.
_PLANNED = ("step_started", "decode_step_started", "admission_step_started")


def step_kinds(workload, setup) -> list[str]:
    """One run of ``workload``: the kind of each of its steps, in order
    ("quiet", "fresh" or "planned"; module docstring)."""
    kinds: list[str] = []
    rec = recorder.StepRecorder
    originals = {name: getattr(rec, name) for name in (*_PLANNED, "decode_repeated")}

    def repeated(self, now, cost, waiting, fresh, *args, **kwargs):
        kinds.append("fresh" if fresh else "quiet")
        return originals["decode_repeated"](self, now, cost, waiting, fresh, *args, **kwargs)

    def planned(name):
        def started(self, *args, **kwargs):
            kinds.append("planned")
            return originals[name](self, *args, **kwargs)
        return started

    try:
        rec.decode_repeated = repeated
        for name in _PLANNED:
            setattr(rec, name, planned(name))
        SimEngine().run(workload, setup)
    finally:
        for name, method in originals.items():
            setattr(rec, name, method)
    return kinds


def mean_quiet_run(kinds: list[str]) -> float:
    """The mean length of an unbroken sequence of quiet steps (0 without any)."""
    runs = [len(list(group)) for kind, group in itertools.groupby(kinds) if kind == "quiet"]
    return statistics.mean(runs) if runs else 0.0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design", default="q6")
    ap.add_argument("--seed-index", type=int, default=0,
                    help="which of the design's seeds (its cells at that seed)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per cell (best taken)")
    ap.add_argument("--cpu", type=int, default=0, help="pin to this core (-1: do not pin)")
    args = ap.parse_args(argv)
    where = pin_cpu(args.cpu)
    d = design(args.design)
    seed = d.seeds[args.seed_index]
    cells = [c for c in d.configs() if c.seed == seed]
    print(f"{d.name}: {len(cells)} cells at seed {seed}, {cells[0].requests} requests each, "
          f"best of {args.repeats} runs, {where}")
    head = ("org", "budget", "headroom", "steps", "quiet", "fresh", "planned", "quiet run",
            "CPU s", "us/step")
    print("".join(f"{h:>10}" for h in head))
    by_org: dict[str, list[float]] = collections.defaultdict(list)
    for config in cells:
        workload, setup = build_run_workload(config), RunSetup.resolve(config)
        times = []
        for _ in range(args.repeats):
            gc.collect()
            t = time.process_time()
            SimEngine().run(workload, setup)
            times.append(time.process_time() - t)
        kinds = step_kinds(workload, setup)
        count, steps, cpu = collections.Counter(kinds), len(kinds), min(times)
        by_org[config.org].append(cpu)
        row = (config.org, config.budget, f"{config.headroom:g}", steps, count["quiet"],
               count["fresh"], count["planned"], f"{mean_quiet_run(kinds):.1f}",
               f"{cpu:.3f}", f"{1e6 * cpu / steps:.1f}")
        print("".join(f"{v:>10}" for v in row))
    for org, cpus in by_org.items():
        print(f"mean CPU s per cell, {org}: {statistics.mean(cpus):.3f}")
    print(f"mean CPU s per cell, grid: {statistics.mean(c for v in by_org.values() for c in v):.3f}")


if __name__ == "__main__":
    main()
