"""hbench's PyTorch Falcon-H1 against transformers' FalconH1ForCausalLM on the same weights.

Both load one model directory written by `adapters.tiny_model.write_weights`
(random weights, every muP multiplier away from 1, norm and D weights away
from 1). Tolerance: max |logit difference| <= `rel_tol` x max |reference logit|,
the float32 rounding bound of the longest path through the model (measured
differences are 4e-6 to 6e-6 of the logit scale, the bound ~8e-4 at 1,100
tokens, a wrong multiplier 0.2 or more).
Every chunked or decoded run hands its SSM and conv state through pages
between calls (gathered from and scattered to a pool, as an engine does).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from adapters.tiny_model import TinyFalconH1, random_weights, write_weights  # noqa: E402
from adapters.torch.model import FalconH1  # noqa: E402
from adapters.torch.paging import (  # noqa: E402
    StatePlacement,
    gather_state,
    kv_view,
    lay_over_pages,
    page_pool,
    scatter_state,
)
from tests.support.floats import sum_tolerance  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


VOCAB = 128
PROMPT = 1100            # crosses two 512-token blocks
MULTIPLIERS = {
    "embedding_multiplier": 1.7, "attention_in_multiplier": 0.8, "key_multiplier": 1.3,
    "attention_out_multiplier": 0.7, "ssm_in_multiplier": 1.2, "ssm_out_multiplier": 0.9,
    "ssm_multipliers": [0.9, 1.1, 1.2, 0.8, 1.3], "mlp_multipliers": [1.25, 0.75],
    "lm_head_multiplier": 0.6,
}
# gate: SiLU gate, one B/C group. norm: gated RMSNorm over 2 groups, biases on every
# projection, tied embeddings. norm_after: the gate applied before the norm, dt clamped
# (time_step_limit; the softplus of most dt is above 0.4).
VARIANTS = {
    "gate": (dict(mamba_n_groups=1), {}),
    "norm": (dict(mamba_n_groups=2, mamba_rms_norm=True),
             dict(mamba_norm_before_gate=True, attention_bias=True, mlp_bias=True,
                  projectors_bias=True, mamba_proj_bias=True, tie_word_embeddings=True)),
    "norm_after": (dict(mamba_n_groups=2, mamba_rms_norm=True),
                   dict(mamba_norm_before_gate=False, time_step_limit=[0.01, 0.4])),
}
BIASES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "feed_forward.gate_proj", "feed_forward.up_proj", "feed_forward.down_proj",
          "mamba.in_proj", "mamba.out_proj")


DIMS = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=8,
            mamba_d_state=16, mamba_chunk_size=16)


def rel_tol(tokens: int) -> float:
    """How far two float32 evaluations of a logit may differ, relative to the
    logit scale, over a context of ``tokens``: twice gamma of the roundings on
    the longest path (`tests.support.floats`). A layer's longest branch is
    attention (q/k projections, the score, the softmax's weighted sums over the
    context, o_proj: see `tests.support.attention`) or the Mamba mixer
    (in_proj, the conv, the scan's 2T + N, the norm, out_proj), then its
    RMSNorm and residual adds; the final norm and lm_head close the path. Each
    rounding acts on values of the logits' order (RMS-normed activations,
    weights scaled by fan-in), so the bound is relative to the logit scale."""
    h, d = DIMS["hidden_size"], DIMS["head_dim"]
    attention = (h + 1) + (d + 1) + (3 * tokens + 4) + h
    mamba = (h + 2) + 5 + (2 * tokens + DIMS["mamba_d_state"]) + 2 * DIMS["mamba_d_ssm"]
    mlp = h + DIMS["intermediate_size"]
    per_layer = max(attention, mamba, mlp) + h + 2
    return sum_tolerance(1.0, DIMS["num_hidden_layers"] * per_layer + 2 * h)


def write_model(path, variant: str) -> None:
    dims, flags = VARIANTS[variant]
    spec = TinyFalconH1(**DIMS, vocab_size=VOCAB, **dims)
    w = random_weights(spec, VOCAB, seed=3)
    rng = np.random.default_rng([3, 1])
    for name in w:
        if name.endswith("norm.weight") or name.endswith(".D"):
            w[name] = rng.uniform(0.5, 1.5, w[name].shape).astype(np.float32)
    if flags.get("attention_bias"):
        for i in range(spec.num_hidden_layers):
            for mod in BIASES:
                rows = w[f"model.layers.{i}.{mod}.weight"].shape[0]
                w[f"model.layers.{i}.{mod}.bias"] = rng.normal(0, 0.1, rows).astype(np.float32)
    if flags.get("tie_word_embeddings"):
        del w["lm_head.weight"]
    write_weights(path, spec, VOCAB, seed=3, weights=w, config_overrides=MULTIPLIERS | flags)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory):
    """One variant: hbench's model, transformers' model, a prompt and its reference logits."""
    path = tmp_path_factory.mktemp(f"falcon-{request.param}")
    write_model(path, request.param)
    ref_model = transformers.FalconH1ForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager").eval()
    tokens = torch.tensor(np.random.default_rng(7).integers(0, VOCAB, PROMPT))
    with torch.no_grad():
        ref = ref_model(tokens[None]).logits[0]
    return SimpleNamespace(model=FalconH1.from_dir(path), ref_model=ref_model, ref=ref,
                           tokens=tokens, path=path)


def assert_close(got, ref, tokens: int = PROMPT):
    """Within the rounding bound over ``tokens`` of context (the prompt's, the longest)."""
    err, scale, tol = float((got - ref).abs().max()), float(ref.abs().max()), rel_tol(tokens)
    assert err <= tol * scale, f"max |diff| {err:.3g} > {tol:.3g} x logit scale {scale:.3g}"


class Pages:
    """An engine's pools: K/V blocks of ``block`` tokens; checkpoints over 3 member + 1 conv page."""

    def __init__(self, model: FalconH1, block: int, pages: int):
        s = model.shapes
        self.shapes, self.block = s, block
        self.kv = kv_view(page_pool(pages, s.n_layers, s.kv_block_elems(block)), s, block)
        self.tables: list[list[int]] = []
        self.free = list(np.random.default_rng(pages).permutation(pages))  # scattered page ids
        member = -(-s.ssm_elems // 3)
        self.state_pool = page_pool(64, s.n_layers, max(member, s.conv_elems))
        self.placements: list[StatePlacement] = []

    def add_request(self, tokens: int) -> int:
        n = -(-tokens // self.block)
        self.tables.append([int(self.free.pop()) for _ in range(n)])
        base = 4 * len(self.placements)
        page = self.state_pool.shape[-1]
        self.placements.append(StatePlacement(
            lay_over_pages([base + 2, base, base + 3], self.shapes.ssm_elems, page),
            lay_over_pages([base + 1], self.shapes.conv_elems, page)))
        ssm, conv = self.shapes.zero_state()
        scatter_state(self.state_pool, self.placements[-1], ssm, conv)
        return len(self.tables) - 1

    def state(self, r: int):
        return gather_state(self.state_pool, self.placements[r], self.shapes)

    def store(self, r: int, ssm, conv) -> None:
        scatter_state(self.state_pool, self.placements[r], ssm, conv)


def prefill(model, pages: Pages, r: int, tokens, grid: int, start: int = 0):
    """Prefill ``tokens`` in chunks ending at multiples of ``grid``, state through the pages."""
    out, pos = [], start
    while pos < start + len(tokens):
        end = min((pos // grid + 1) * grid, start + len(tokens))
        ssm, conv = pages.state(r)
        out.append(model.prefill_chunk(tokens[pos - start:end - start], pos, pages.kv,
                                       pages.tables[r], ssm, conv))
        pages.store(r, ssm, conv)
        pos = end
    return torch.cat(out)


@pytest.mark.slow
def test_whole_prompt_prefill_matches_transformers(pair):
    model, ref, tokens = pair.model, pair.ref, pair.tokens
    pages = Pages(model, block=32, pages=40)
    r = pages.add_request(PROMPT)
    ssm, conv = pages.state(r)
    assert_close(model.prefill_chunk(tokens, 0, pages.kv, pages.tables[r], ssm, conv), ref)
    last = model.prefill_chunk(tokens, 0, pages.kv, pages.tables[r], *pages.shapes.zero_state(),
                               last_only=True)
    assert_close(last, ref[-1:])


@pytest.mark.slow
@pytest.mark.parametrize("grid", [16, 512])
def test_chunked_prefill_at_a_grid_matches_transformers(pair, grid):
    model, ref, tokens = pair.model, pair.ref, pair.tokens
    pages = Pages(model, block=grid, pages=-(-PROMPT // grid) + 2)
    r = pages.add_request(PROMPT)
    assert_close(prefill(model, pages, r, tokens, grid), ref)


def test_batched_decode_after_prefill_matches_transformers(pair):
    """Three requests of different lengths prefilled, then decoded together token by token."""
    model, ref, tokens = pair.model, pair.ref, pair.tokens
    starts, steps = [40, 509, 70], 12   # the second crosses its 512th token while decoding
    seqs = [tokens, torch.roll(tokens, 300), torch.roll(tokens, 600)]
    refs = [ref]
    for s in seqs[1:]:
        with torch.no_grad():
            refs.append(pair.ref_model(s[None, :600]).logits[0])
    pages = Pages(model, block=16, pages=200)
    for start, s in zip(starts, seqs, strict=True):
        r = pages.add_request(start + steps)
        prefill(model, pages, r, s[:start], grid=64)
    for step in range(steps):
        pos = [start + step for start in starts]
        toks = torch.stack([s[p] for s, p in zip(seqs, pos, strict=True)])
        states = [pages.state(r) for r in range(3)]
        ssm = torch.stack([s for s, _ in states])
        conv = torch.stack([c for _, c in states])
        logits = model.decode(toks, torch.tensor(pos), pages.kv, pages.tables, ssm, conv)
        for r in range(3):
            pages.store(r, ssm[r], conv[r])
            assert_close(logits[r:r + 1], refs[r][pos[r]:pos[r] + 1])


SCALAR_MULTIPLIERS = [k for k, v in MULTIPLIERS.items() if not isinstance(v, list)]
LIST_MULTIPLIERS = [(k, i) for k, v in MULTIPLIERS.items() if isinstance(v, list)
                    for i in range(len(v))]


@pytest.mark.parametrize("pair", ["norm"], indirect=True)
@pytest.mark.parametrize("field", SCALAR_MULTIPLIERS + LIST_MULTIPLIERS
                         + ["mamba_norm_before_gate"], ids=str)
def test_a_wrong_multiplier_breaks_parity(pair, field):
    """Each multiplier (and the gate order) matters: a wrong one moves the logits far out.

    Scales one multiplier by 1.25 (or flips mamba_norm_before_gate) in hbench's
    model only and prefills the first 256 prompt tokens.
    """
    model, ref, tokens = pair.model, pair.ref[:256], pair.tokens[:256]
    if isinstance(field, tuple):
        name, i = field
        values = list(getattr(model.cfg, name))
        values[i] *= 1.25
        change = {name: tuple(values)}
    else:
        value = getattr(model.cfg, field)
        change = {field: not value if isinstance(value, bool) else value * 1.25}
    wrong = FalconH1(dataclasses.replace(model.cfg, **change),
                     load_file(str(pair.path / "model.safetensors")))
    pages = Pages(wrong, block=512, pages=1)
    r = pages.add_request(len(tokens))
    got = wrong.prefill_chunk(tokens, 0, pages.kv, pages.tables[r], *pages.state(r))
    assert_close(model.prefill_chunk(tokens, 0, pages.kv, pages.tables[r], *pages.state(r)), ref,
                 tokens=256)
    err = float((got - ref).abs().max())
    assert err > 10 * rel_tol(256) * float(ref.abs().max()), f"{change}: max |diff| only {err:.3g}"


def test_a_request_continuing_from_a_shared_prefix_matches_a_clean_recompute(pair):
    """B reuses A's first 512-token block (the same page) and A's checkpoint at 512.

    A's state is published at the block boundary into its own pages; B adopts
    the block by naming the page in its table, gathers the checkpoint, and
    prefills only its own suffix. B's logits must equal a clean whole-prompt
    run of B's tokens (what the study found did not always hold).
    """
    model, tokens = pair.model, pair.tokens
    b_tokens = torch.cat([tokens[:512], torch.roll(tokens, 41)[512:700]])
    with torch.no_grad():
        ref_b = pair.ref_model(b_tokens[None]).logits[0]
    pages = Pages(model, block=512, pages=6)
    a = pages.add_request(900)
    ssm, conv = pages.state(a)
    model.prefill_chunk(tokens[:512], 0, pages.kv, pages.tables[a], ssm, conv)
    published = pages.add_request(0)               # a checkpoint's pages, no K/V blocks
    pages.store(published, ssm, conv)
    model.prefill_chunk(tokens[512:900], 512, pages.kv, pages.tables[a], ssm, conv)  # A goes on
    b = pages.add_request(700)
    pages.tables[b][0] = pages.tables[a][0]        # adopt A's block 0
    ssm_b, conv_b = pages.state(published)         # adopt the checkpoint at 512
    got = model.prefill_chunk(b_tokens[512:], 512, pages.kv, pages.tables[b], ssm_b, conv_b)
    assert_close(got, ref_b[512:])
