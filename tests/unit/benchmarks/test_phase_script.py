"""The phase script `bench_process` and `bench_scale` run in a fresh process
(`benchmarks.bench_scale.PHASE_SCRIPT`) restates what `hbench run` does, so
it breaks when the run path's names move: one small run here keeps
`make bench` working."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from benchmarks.bench_scale import PHASE_SCRIPT
from harness.results import read_run
from tests.support import REPO_ROOT


def test_the_phase_script_times_a_run_it_writes_whole(tmp_path):
    done = subprocess.run([sys.executable, "-c", PHASE_SCRIPT, "s2", "8", "3.0", str(tmp_path),
                           repr(time.time())], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    phases = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"imports", "setup", "workload", "engine", "writing"} <= set(phases)
    assert all(phases[k] >= 0 for k in ("setup", "workload", "engine", "writing"))
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = read_run(run_dir)
    assert run.manifest["config"]["requests"] == 8 and run.manifest["config"]["org"] == "s2"
