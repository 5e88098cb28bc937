"""What a study-sized simulated ``hbench run --json`` does not load: scipy
(once the KS p-value of its arrivals is remembered, `harness.validity`), the
HTTP client (a served run's alone), rich's progress display, tables and
console (``--json`` prints none of them), and the corpus it derives from (its
workload is read back from `workloads.derived_cache`). The first run of a
fresh cache loads scipy and the corpus, which shows the probe sees them.

Each run is a fresh interpreter (a test process has long imported everything)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_LOADED = ("scipy", "http.client", "rich.console", "rich.progress", "rich.table",
              "workloads.corpus", "workloads.sharegpt.derive")
ARGS = ["run", "--org", "s2", "--budget", "b83", "--rate", "3", "--requests", "240",
        "--seed", "1", "--json"]

PROBE = """
import json, sys
args, watched = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["hbench", *args]
from hbench.cli import main
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
sys.stdout.flush()
print(json.dumps({"code": code, "loaded": sorted(m for m in watched if m in sys.modules)}),
      file=sys.stderr)
"""


def _run(cache: Path, out: Path) -> tuple[dict, dict]:
    env = {**os.environ, "HBENCH_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps([*ARGS, "--out", str(out)]),
                           json.dumps(NOT_LOADED)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, proc.stderr
    return report, json.loads(proc.stdout)


def test_a_repeated_study_sized_run_loads_no_scipy_http_client_rich_or_corpus(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    # the parsed ShareGPT pairs of this test session, if any: parsing them is not the point
    for f in Path(os.environ.get("HBENCH_CACHE_DIR", "/nonexistent")).glob("sharegpt-*.arrow"):
        shutil.copy(f, cache / f.name)
    first, summary1 = _run(cache, tmp_path / "a")
    assert {"scipy", "workloads.corpus"} <= set(first["loaded"])   # the probe sees them
    again, summary2 = _run(cache, tmp_path / "b")
    assert again["loaded"] == []
    checks = [s["validity"]["checks"]["arrival_process"] for s in (summary1, summary2)]
    assert checks[0] == checks[1] and "KS test" in checks[0]["detail"]
