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
