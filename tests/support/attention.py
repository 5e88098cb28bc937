"""The exact softmax attention the torch engine's paged kernels are held to, and
the float32 rounding bound between them (see `tests.support.floats`)."""

from __future__ import annotations

import torch

from tests.support.floats import gamma


def _scores(q, k, v, q_pos, scale):
    """GQA by repetition; scores in float64 with later keys masked per query."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1).double(), v.repeat_interleave(g, dim=1).double()
    s = torch.einsum("thd,nhd->htn", q.double(), k) * scale
    future = torch.arange(k.shape[0])[None, :] > q_pos[:, None]
    return s.masked_fill(future, float("-inf")), k, v, future


def exact_attention(q, k, v, q_pos, scale):
    """softmax(q k^T * scale) v over the keys at positions <= each query's, in
    float64, returned as float32: ``q [t, heads, d]``, ``k, v [n, kv_heads, d]``."""
    s, _, v, _ = _scores(q, k, v, q_pos, scale)
    return torch.einsum("htn,nhd->thd", torch.softmax(s, dim=-1), v).float()


def attention_tolerance(q, k, v, q_pos, scale):
    """Per output element ``[t, heads, d]``, how far a float32 evaluation may be
    from `exact_attention`, in any summation order and any split into blocks.

    A score is a d-term dot times the scale: its absolute error, up to
    ``gamma(d + 1) * scale * sum |q_i k_i|``, becomes a relative error of its
    weight through exp (twice: numerator and the normalizer). The rest is
    relative to the output's terms, ``sum_j p_j |v_j|``: exp and the running
    maximum's subtraction (2 roundings), one rescale per block (at most L), the
    L-term weighted sums of values and of weights (2L), the division and the
    rounding of the exact float64 answer to float32 (2): 3L + 4 in all.
    """
    s, kk, v, future = _scores(q, k, v, q_pos, scale)
    p = torch.softmax(s, dim=-1)                                          # [h, t, n]
    abs_out = torch.einsum("htn,nhd->thd", p, v.abs())
    d = q.shape[-1]
    dot_abs = torch.einsum("thd,nhd->htn", q.double().abs(), kk.abs()) * scale
    score_err = (gamma(d + 1) * dot_abs.masked_fill(future, 0)).amax(-1)   # [h, t]
    visible = (~future).sum(-1).double()                                   # [t]
    roundings = torch.tensor([gamma(int(3 * n + 4)) for n in visible], dtype=torch.float64)
    rel = 2 * score_err.T[:, :, None] + roundings[:, None, None]           # [t, h, 1]
    return abs_out * rel
