"""The torch engine's decode through the paged state kernels (Triton's interpreter on CPU).

On a GPU the engine decodes with the recurrent states left in their pages,
read and updated by the state kernels; on CPU the gather/compute/scatter
path stays the default. Here the kernels are forced on CPU tensors: served
runs must still equal a cold, contiguous recomputation token for token
(`adapters.torch.continuation`, poisoning on), with checkpoints adopted.
The workloads are tiny because the interpreter runs every kernel program in
Python.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"      # before triton is first imported
torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("safetensors")

import adapters.torch.kernels.mixer as kernel_mixer  # noqa: E402
from adapters.torch.continuation import (  # noqa: E402
    all_at_once,
    verify_config,
    verify_continuation,
)
from adapters.torch.engine import TorchEngine, use_kernels  # noqa: E402
from harness.run_setup import validate  # noqa: E402
from harness.run_workload import build_run_workload  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: org -> budget of a tiny shared-prefix workload (3 requests of ~1,100 tokens, 3
#: output tokens, one context) at which the later requests adopt a checkpoint.
TINY = {"s0": "b5", "s1": "b4", "s2": "b4"}


def tiny_config(org, model_dir):
    return dataclasses.replace(verify_config(org, str(model_dir), budget=TINY[org]),
                               requests=3, max_output=3, mean_input=1100, contexts=1)


@pytest.fixture
def paged_calls(monkeypatch):
    """How many times a layer's Mamba branch ran through the state kernels."""
    calls = []
    real = kernel_mixer.mixer_paged

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(kernel_mixer, "mixer_paged", counted)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("org", sorted(TINY))
def test_continuation_equals_recomputation_with_the_kernels(model_dir, org, paged_calls):
    rep = verify_continuation(tiny_config(org, model_dir), kernels=True)
    assert rep.all_identical, [c.describe() for c in rep.checks]
    assert rep.stats["adopted_requests"] > 0 and rep.stats["poisoned_pages"] > 0
    assert paged_calls                                   # decode ran in the pages
    assert all(len(c.tokens) == 3 for c in rep.checks)


@pytest.mark.slow
@pytest.mark.parametrize("org", ["u0", "e0"])
def test_the_kernels_address_a_region_s_pages(model_dir, org, paged_calls):
    """U0 and e0 at b5 with 2,000-token prompts (past their 1,792-token grid):
    the state kernels read live states at the checkpoint end of the region's
    buffer; e0 moves capacity and the engine relocates pages under them."""
    config = dataclasses.replace(verify_config(org, str(model_dir), budget="b5"), requests=3,
                                 max_output=3, mean_input=2000, contexts=1)
    rep = verify_continuation(config, kernels=True)
    assert rep.all_identical, [c.describe() for c in rep.checks]
    assert rep.stats["adopted_requests"] > 0 and paged_calls
    if org == "e0":
        assert rep.stats["capacity_moves"] > 0 and rep.stats["region_relocations"] > 0


def test_cpu_keeps_the_torch_path_by_default(model_dir, paged_calls):
    config = tiny_config("s2", model_dir)
    engine = TorchEngine()
    run = engine.run(all_at_once(build_run_workload(config)), validate(config))
    assert run.engine_info["state_kernels"] == "torch"
    assert not paged_calls and all(r.status == "finished" for r in run.requests)


def test_kernels_are_chosen_on_a_gpu_and_when_asked():
    assert use_kernels("cuda", None) and use_kernels("cuda:1", None)
    assert not use_kernels("cpu", None)
    assert use_kernels("cpu", True) and not use_kernels("cuda", False)


@pytest.mark.slow
def test_kernel_and_torch_decode_compute_the_same_tokens(model_dir, paged_calls):
    """Same workload both ways, every request prefilled in one step and then
    decoded together: identical tokens, logits within float32 rounding."""
    config = dataclasses.replace(tiny_config("s1", model_dir), budget="b12", token_budget=4096)
    workload = all_at_once(build_run_workload(config))
    runs = {}
    for kernels in (False, True):
        engine = TorchEngine(keep_logits=True, kernels=kernels)
        run = engine.run(workload, validate(config))
        assert run.engine_info["state_kernels"] == ("triton" if kernels else "torch")
        runs[kernels] = engine
    assert max(paged_calls) == 3                         # one batch of three requests
    assert runs[True].outputs == runs[False].outputs
    for rid, logits in runs[False].logits.items():
        for a, b in zip(logits, runs[True].logits[rid], strict=True):
            assert float((a - b).abs().max()) <= 1e-4 * float(a.abs().max())
