"""`hbench verify --engine torch`: continuation from checkpoints equals a cold recompute.

For every organization the served run must really adopt checkpoints and
really preempt and resume requests (counted by the engine), with every freed
page poisoned; each request's greedy tokens must then equal a cold,
contiguous run of its prompt and its logits agree within float32 rounding.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from adapters.torch.continuation import REL_TOL, cold_run  # noqa: E402
from hbench.cli import cli  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("org", ["s0", "s1", "s2", "d0"])
def test_continuation_equals_recomputation(model_dir, org):
    res = CliRunner().invoke(cli, ["verify", "--engine", "torch", "--org", org,
                                   "--model", str(model_dir)])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    summary = next(line for line in lines if line.startswith(f"{org}: "))
    adopted = int(summary.split(": ")[1].split()[0])
    preemptions = int(summary.split("copies), ")[1].split()[0])
    assert adopted > 0 and preemptions > 0, summary
    assert "pages poisoned" in summary and " 0 pages poisoned" not in summary
    n = len([line for line in lines if line.startswith("request ")])
    assert lines[-1] == f"{n}/{n} requests identical to a cold run"
    assert n >= 8 and "DIVERGES" not in res.output


@pytest.mark.slow
@pytest.mark.parametrize("org", ["u0", "e0"])
def test_continuation_equals_recomputation_while_the_region_is_split_anew(model_dir, org):
    """U0 and e0 at their verify points: requests adopt checkpoints and one is
    preempted and resumed, each pool of the region grows and gives pages back;
    e0 moves capacity and u0 compacts its sides (no capacity move), and the
    engine relocates pages in the region's buffer for both; every request
    equals its cold run."""
    res = CliRunner().invoke(cli, ["verify", "--engine", "torch", "--org", org,
                                   "--model", str(model_dir)])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    summary = next(line for line in lines if line.startswith(f"{org}: ") and "adopted" in line)
    assert int(summary.split(": ")[1].split()[0]) > 0, summary
    assert "pages poisoned" in summary and " 0 pages poisoned" not in summary
    region = next(line for line in lines if line.startswith(f"{org}: region: "))
    grown = [int(x.split(" pages")[0]) for x in region.split("grew ")[1:]]
    back = [int(x.split(",")[0]) for x in region.split("gave back ")[1:]]
    assert len(grown) == len(back) == 2 and min(grown) > 0 and min(back) > 0, region
    relocated = int(region.split(", ")[-2].split()[0])
    moves = int(region.split(", ")[-1].split()[0])
    preemptions = int(summary.split("copies), ")[1].split()[0])
    assert preemptions > 0, summary
    assert relocated > 0 and (moves == 0 if org == "u0" else moves > 0), region
    n = len([line for line in lines if line.startswith("request ")])
    assert lines[-1] == f"{n}/{n} requests identical to a cold run"
    assert n >= 8 and "DIVERGES" not in res.output


@pytest.mark.slow
def test_a_perturbed_model_is_caught(model_dir):
    """The comparison can fail: a cold run of another model's weights differs."""
    from adapters.torch.model import FalconH1

    m = FalconH1.from_dir(model_dir)
    prompt = list(range(3, 700))
    tokens, logits = cold_run(m, prompt, 4)
    m.final_norm = m.final_norm * 1.5
    tokens2, logits2 = cold_run(m, prompt, 4)
    rel = float((logits[0] - logits2[0]).abs().max() / logits2[0].abs().max())
    assert rel > REL_TOL


def test_verify_torch_needs_a_model_directory():
    res = CliRunner().invoke(cli, ["verify", "--engine", "torch", "--org", "s2"])
    assert res.exit_code != 0 and "Error: --engine torch needs --model DIR" in res.output


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """`hbench tiny-model`'s default preset: a checkpoint tiny beside an attention block."""
    from adapters.tiny_model import PRESETS, write_weights

    d = tmp_path_factory.mktemp("tiny")
    write_weights(d, PRESETS["tiny"], 512, seed=0)
    return d


def test_the_verify_point_scales_with_the_models_geometry(model_dir, tiny_dir):
    """The documented points are the proportional model's; on the default tiny
    model (where b8 gives S0 no page) each organization gets the smallest page
    count at which the simulator adopts and preempts."""
    from hbench.verify import exercises_continuation, torch_verify_config

    assert [torch_verify_config(o, str(model_dir)).budget for o in ("s0", "s1", "s2", "d0")] == \
        ["b8", "b8", "b8", "b12"]
    for org in ("s0", "s2"):
        config = torch_verify_config(org, str(tiny_dir))
        assert config.budget.endswith("p") and exercises_continuation(config)
        smaller = f"{int(config.budget[:-1]) - 1}p"
        assert not exercises_continuation(config.__class__(**{**config.to_dict(), "budget": smaller}))
    assert torch_verify_config("s0", str(tiny_dir), budget="b99").budget == "b99"   # given: kept


@pytest.mark.slow
def test_verify_runs_on_the_default_tiny_model(tiny_dir):
    res = CliRunner().invoke(cli, ["verify", "--engine", "torch", "--org", "s0",
                                   "--model", str(tiny_dir)])
    assert res.exit_code == 0, res.output
    summary = next(line for line in res.output.splitlines() if line.startswith("s0: "))
    assert " 0 requests adopted" not in summary and " 0 preemptions" not in summary
