"""The Mamba-2 branch of one decode token, with its state read where it lies.

`adapters.torch.mamba.mixer` computes the same thing on states gathered out
of their pages; here the two state kernels update them in the pool itself,
so a decode step moves no state but what the kernels read and write:

    in_proj -> z, xBC, dt
    xBC     -> conv_update_paged   (conv state: shifted in its page / slot)
    x, B, C -> ssm_update_paged    (SSM state: updated in its member pages; + D x)
    y       -> gated RMS norm with z (or SiLU gate) -> out_proj
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from adapters.torch.config import FalconH1Config
from adapters.torch.kernels.conv_update import conv_update_paged
from adapters.torch.kernels.ssm_update import ssm_update_paged
from adapters.torch.kernels.tables import StateTables
from adapters.torch.layers import gated_rms_norm


def mixer_paged(h: torch.Tensor, w: dict, cfg: FalconH1Config, mup: torch.Tensor,
                pool_layer: torch.Tensor, tables: StateTables) -> torch.Tensor:
    """The Mamba branch for ``h [b, hidden]`` (already normed) of ``b`` requests
    whose states lie in ``pool_layer`` (``pool[:, layer]``) at ``tables``;
    returns ``[b, hidden]``, not yet scaled by ``ssm_out_multiplier``."""
    b = h.shape[0]
    H, P = cfg.mamba_n_heads, cfg.mamba_d_head
    G, N = cfg.mamba_n_groups, cfg.mamba_d_state
    zxbcdt = F.linear(h * cfg.ssm_in_multiplier, w["in_proj.weight"], w.get("in_proj.bias")) * mup
    z, xbc, dt = zxbcdt.split([cfg.mamba_d_ssm, cfg.conv_dim, H], dim=-1)
    xbc = conv_update_paged(pool_layer, tables, xbc, w["conv1d.weight"], w.get("conv1d.bias"))
    x, Bm, Cm = xbc.split([cfg.mamba_d_ssm, G * N, G * N], dim=-1)
    y = ssm_update_paged(pool_layer, tables, x.reshape(b, H, P), dt, -torch.exp(w["A_log"]),
                         Bm.reshape(b, G, N), Cm.reshape(b, G, N), w["D"], w["dt_bias"],
                         cfg.time_step_limit)
    y = y.reshape(b, 1, cfg.mamba_d_ssm)
    if cfg.mamba_rms_norm:
        y = gated_rms_norm(y, z[:, None], w["norm.weight"], cfg.rms_norm_eps, G,
                           cfg.mamba_norm_before_gate)
    else:
        y = y * F.silu(z[:, None])
    return F.linear(y[:, 0], w["out_proj.weight"], w.get("out_proj.bias"))
