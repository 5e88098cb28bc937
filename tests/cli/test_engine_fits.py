"""`harness.engine.fits.check_fits` refuses, before any step, a budget in which
the longest request is preempted by its own prefill and can never be admitted
again (the vLLM-paging point where S1/S2 at 8 blocks served nothing, though
its pages alone fit), and leaves the organization it was given untouched."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hbench.cli import cli

# vLLM's paging on the proportional model: one 1,664-token block per page;
# shared contexts of ~2,900 tokens, a longest request of 3,951
WORKLOAD = ["--paging", "vllm", "--requests", "16", "--rate", "50", "--mean-input", "3000",
            "--max-output", "400", "--contexts", "2", "--max-model-len", "4096", "--cap", "16",
            "--seed", "0", "--token-budget", "1664"]


def run(model_dir, tmp_path, org: str, budget: str):
    return CliRunner().invoke(cli, ["run", "--engine", "sim", "--org", org, "--budget", budget,
                                    "--model", str(model_dir), *WORKLOAD,
                                    "--out", str(tmp_path), "--json"])


@pytest.mark.parametrize("org", ["s1", "s2"])
def test_a_budget_the_longest_request_cannot_finish_in_is_refused_before_any_step(
        model_dir, tmp_path, org):
    result = run(model_dir, tmp_path, org, "b10")
    assert result.exit_code != 0
    assert (f"budget b10 cannot serve {org}'s longest request (3951 tokens) even alone under "
            "the scheduler's rules") in result.output
    assert not list(tmp_path.iterdir())              # no results directory was started


@pytest.mark.parametrize("org, budget", [("s0", "b10"), ("d0", "b10"), ("s1", "b13"),
                                         ("s2", "b12")])
def test_a_budget_the_rehearsal_passes_serves_every_request(model_dir, tmp_path, org, budget):
    result = run(model_dir, tmp_path, org, budget)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["finished"] == 16 and summary["failed"] == 0


def test_the_rehearsal_leaves_the_organization_untouched(model_dir):
    from adapters.sim.engine import SimEngine
    from harness.config import RunConfig
    from harness.engine.fits import check_fits
    from harness.run_setup import RunSetup
    from harness.run_workload import build_run_workload

    config = RunConfig(org="s2", budget="b13", engine="sim", model=str(model_dir),
                       paging="vllm", requests=16, rate=50, mean_input=3000, max_output=400,
                       contexts=2, max_model_len=4096, cap=16, seed=0, token_budget=1664)
    setup = RunSetup.resolve(config)
    org = SimEngine().build(setup)
    before = (org.usage(), org.available_pages(), org.version)
    check_fits(org, build_run_workload(config), config, "b13")
    assert (org.usage(), org.available_pages(), org.version) == before
