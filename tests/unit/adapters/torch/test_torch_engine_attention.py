"""The torch engine's attention is the online softmax over blocks, poison-proof.

`tests/unit/adapters/torch/test_torch_attention.py` shows that the online softmax equals the
exact softmax; here: every engine step really goes through it (prefill
chunks through `paged_attention`, decode batches through
`paged_decode_attention`), and a decode batch whose unused slots and padding
pages hold NaN (a poisoned pool) still equals the exact softmax.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from adapters.tiny_model import PRESETS, write_weights  # noqa: E402
from adapters.torch import model as model_module  # noqa: E402
from adapters.torch.attention import paged_decode_attention  # noqa: E402
from adapters.torch.engine import TorchEngine  # noqa: E402
from adapters.torch.paging import block_table_tensor  # noqa: E402
from harness.config import RunConfig  # noqa: E402
from harness.run_setup import validate  # noqa: E402
from harness.run_workload import build_run_workload  # noqa: E402
from tests.support.attention import attention_tolerance, exact_attention  # noqa: E402
from tests.support.floats import within  # noqa: E402


@pytest.mark.parametrize("block", [16, 512])
def test_decode_over_a_poisoned_pool_equals_exact_softmax(block):
    rng = torch.Generator().manual_seed(block)
    heads, kvh, d, lengths = 4, 2, 8, [1, 40, 700]
    pages = sum(math.ceil(n / block) for n in lengths) + 2
    kv = torch.full((pages, 2, block, kvh, d), float("nan"))    # every slot poisoned
    order = torch.randperm(pages, generator=rng).tolist()
    tables, ks, vs = [], [], []
    for n in lengths:
        table = [order.pop() for _ in range(math.ceil(n / block))]
        k, v = torch.randn(n, kvh, d, generator=rng), torch.randn(n, kvh, d, generator=rng)
        for j, page in enumerate(table):
            m = min(block, n - j * block)
            kv[page, 0, :m], kv[page, 1, :m] = k[j * block:j * block + m], v[j * block:j * block + m]
        tables.append(table)
        ks.append(k)
        vs.append(v)
    q = torch.randn(len(lengths), heads, d, generator=rng)
    pos = torch.tensor(lengths) - 1
    # padded rows point at pages that are poisoned or belong to someone else
    got = paged_decode_attention(q, pos, kv, block_table_tensor(tables), d ** -0.5)
    assert torch.isfinite(got).all()
    for r in range(len(lengths)):
        args = (q[r:r + 1], ks[r], vs[r], pos[r:r + 1], d ** -0.5)
        within(got[r:r + 1], exact_attention(*args), attention_tolerance(*args), f"request {r}")


def test_every_engine_step_attends_through_the_online_softmax(tmp_path, monkeypatch):
    write_weights(tmp_path, PRESETS["proportional"], 512, seed=0)
    calls = {"prefill": 0, "decode": 0}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(model_module, "paged_attention",
                        spy("prefill", model_module.paged_attention))
    monkeypatch.setattr(model_module, "paged_decode_attention",
                        spy("decode", model_module.paged_decode_attention))
    config = RunConfig(engine="torch", org="d0", budget="b12", model=str(tmp_path),
                       config_path=str(tmp_path / "config.json"), requests=3, rate=1000.0,
                       mean_input=300, max_output=5, contexts=1, max_model_len=2048)
    engine, layers = TorchEngine(), PRESETS["proportional"].num_hidden_layers
    run = engine.run(build_run_workload(config), validate(config))
    steps = run.steps
    decode_steps = sum(1 for s in steps if s["decode_requests"] > 0)
    assert decode_steps > 0
    assert calls["decode"] == decode_steps * layers
    assert calls["prefill"] >= sum(1 for s in steps if s["prefill_tokens"] > 0) * layers
