"""The small pieces of a Falcon-H1 layer: norms, rotary embedding, SwiGLU MLP.

Functions of (weights, activations); none holds state. Shapes put tokens
first: ``x`` is ``[..., hidden]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last dimension."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   n_groups: int, norm_before_gate: bool) -> torch.Tensor:
    """Mamba-2's gated RMSNorm: normalise each of ``n_groups`` channel groups separately.

    ``norm_before_gate``: norm(x) * silu(gate); otherwise norm(x * silu(gate)).
    """
    if not norm_before_gate:
        x = x * F.silu(gate)
    shape = x.shape
    g = x.reshape(*shape[:-1], n_groups, shape[-1] // n_groups)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * g.reshape(shape)
    return y * F.silu(gate) if norm_before_gate else y


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[tokens, head_dim]`` for integer ``positions`` (half-split layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=positions.device) / head_dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[tokens, heads, head_dim]`` by the tables of its tokens' positions.

    The two halves of each head form the (real, imaginary) pairs, as Llama-style
    checkpoints (and Falcon-H1) lay them out.
    """
    half = x.shape[-1] // 2
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def swiglu_mlp(x: torch.Tensor, w: dict, gate_mult: float, down_mult: float) -> torch.Tensor:
    """down(up(x) * silu(gate(x) * gate_mult)) * down_mult."""
    gate = F.linear(x, w["gate_proj.weight"], w.get("gate_proj.bias")) * gate_mult
    up = F.linear(x, w["up_proj.weight"], w.get("up_proj.bias"))
    return F.linear(up * F.silu(gate), w["down_proj.weight"], w.get("down_proj.bias")) * down_mult
