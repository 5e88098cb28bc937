"""What a study-sized simulated ``hbench run --json`` does not load: pandas
(its summary and TTFT attribution are computed from NumPy arrays, its tables
built and written through pyarrow's buffers, `common.arrow_arrays`), scipy
(once the KS p-value of its arrivals is remembered, `harness.validity`), the
HTTP client (a served run's alone), rich's progress display, tables and
console (``--json`` prints none of them), the corpus it derives from and the
tokenizer (its workload is read back from `workloads.derived_cache`), the
multi-turn session loop (it serves no sessions) and `importlib.metadata`
(the installed packages' versions are read back from
`harness.installed_versions`). The first run of a fresh cache loads scipy,
the corpus and `importlib.metadata`, which shows the probe sees them.

Each run is a fresh interpreter (a test process has long imported everything)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support import REPO_ROOT
from tests.support.import_probe import loaded

pytestmark = pytest.mark.slow

NOT_LOADED = ("pandas", "scipy", "http.client", "rich.console", "rich.progress", "rich.table",
              "workloads.corpus", "workloads.sharegpt.derive", "workloads.sharegpt.tokenizer",
              "workloads.multiturn.session", "importlib.metadata")
ARGS = ["run", "--org", "s2", "--budget", "b83", "--rate", "3", "--requests", "240",
        "--seed", "1", "--json"]



def probed_run(cache: Path, out: Path) -> tuple[dict, dict]:
    env = {**os.environ, "HBENCH_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO_ROOT)}
    report, stdout = loaded([*ARGS, "--out", str(out)], NOT_LOADED, env=env, timeout=600)
    assert report["code"] == 0, report
    return report, json.loads(stdout)


def test_a_repeated_study_sized_run_loads_no_pandas_scipy_http_client_rich_corpus_or_metadata(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    # the parsed ShareGPT pairs of this test session, if any: parsing them is not the point
    kept = Path(os.environ.get("HBENCH_CACHE_DIR", "/nonexistent")) / "sharegpt-pairs"
    if kept.is_dir():
        shutil.copytree(kept, cache / kept.name)
    first, summary1 = probed_run(cache, tmp_path / "a")
    assert {"scipy", "workloads.corpus", "importlib.metadata"} <= set(first["loaded"])   # seen
    again, summary2 = probed_run(cache, tmp_path / "b")
    assert again["loaded"] == []
    checks = [s["validity"]["checks"]["arrival_process"] for s in (summary1, summary2)]
    assert checks[0] == checks[1] and "KS test" in checks[0]["detail"]
