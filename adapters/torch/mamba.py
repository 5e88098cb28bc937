"""Falcon-H1's Mamba-2 mixer, continuing from a state passed in.

Per token the SSM of head ``h`` keeps ``state [head_dim, d_state]`` and does

    state_t = exp(dt_t * A_h) * state_{t-1} + dt_t * x_t (outer) B_t
    y_t     = state_t @ C_t + D_h * x_t

after a causal depthwise conv (kernel ``d_conv``) over the x, B, C channels
whose last ``d_conv - 1`` inputs are the conv state. The caller owns both
states: `mixer` reads them as the state *before* the tokens and overwrites
them in place with the state *after* the last token, so a prefill split into
chunks computes exactly what one whole-prompt prefill does.

Prefill uses the chunked SSD form (`ssd_scan`): within a chunk of ``L``
tokens the outputs are a masked ``L x L`` product, and the state crosses
chunk boundaries through one decay per chunk. Decode uses the one-step
recurrence (`ssm_step`). `sequential_scan` is the plain loop both must
match (tests compare them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from adapters.torch.config import FalconH1Config
from adapters.torch.layers import gated_rms_norm


def causal_conv(xbc: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU(depthwise causal conv) of ``xbc [B, T, C]`` preceded by ``conv_state [B, C, K-1]``.

    Returns the activations ``[B, T, C]`` and the new conv state (the last
    ``K - 1`` inputs, earlier state included when ``T < K - 1``).
    """
    width = conv_state.shape[-1]
    full = torch.cat((conv_state, xbc.transpose(1, 2)), dim=-1)      # [B, C, K-1+T]
    out = F.conv1d(full, weight, bias, groups=full.shape[1])          # [B, C, T]
    return F.silu(out).transpose(1, 2), full[..., full.shape[-1] - width:]


def ssm_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, state: torch.Tensor, in_place: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: ``x [b, H, P]``, ``dt [b, H]``, ``B, C [b, G, N]``, ``state [b, H, P, N]``.

    Heads ``g * H/G .. (g + 1) * H/G - 1`` share group ``g``'s B and C.
    Returns ``y [b, H, P]`` (without the D skip) and the new state, which is
    ``state`` itself, updated, when ``in_place``.
    """
    b, H, P = x.shape
    G, N = B.shape[1:]
    decay = torch.exp(dt * A)[..., None, None]
    new = state.mul_(decay) if in_place else state * decay
    grouped = new.view(b, G, H // G, P, N)
    grouped.addcmul_((dt[..., None] * x).view(b, G, H // G, P, 1), B.view(b, G, 1, 1, N))
    y = torch.einsum("bgkpn,bgn->bgkp", grouped, C)
    return y.reshape(b, H, P), new


def sequential_scan(x, dt, A, B, C, state):
    """The recurrence token by token: ``x [b, T, H, P]``, ``dt [b, T, H]``, ``B, C [b, T, G, N]``."""
    ys = []
    for t in range(x.shape[1]):
        y, state = ssm_step(x[:, t], dt[:, t], A, B[:, t], C[:, t], state)
        ys.append(y)
    return torch.stack(ys, dim=1), state


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, state: torch.Tensor, chunk: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """`sequential_scan` in chunked (SSD) form; same arguments plus the chunk length.

    For tokens ``s <= t`` of one chunk with ``cs`` the running sum of
    ``dt * A``: ``y_t = sum_s exp(cs_t - cs_s) (C_t . B_s) dt_s x_s +
    exp(cs_t) C_t . state_in``, and ``state_out = exp(cs_last) state_in +
    sum_s exp(cs_last - cs_s) dt_s x_s (outer) B_s``. Heads stay grouped
    (``[G, H/G]``) so B and C are never copied per head.
    """
    b, T, H, P = x.shape
    G, N = B.shape[2:]
    k = H // G
    state = state.reshape(b, G, k, P, N)
    ys = []
    for lo in range(0, T, chunk):
        xc, dtc = x[:, lo:lo + chunk], dt[:, lo:lo + chunk]
        Bc, Cc = B[:, lo:lo + chunk], C[:, lo:lo + chunk]
        L = xc.shape[1]
        cs = torch.cumsum(dtc * A, dim=1)                                  # [b, L, H]
        seg = cs[:, :, None, :] - cs[:, None, :, :]                        # [b, t, s, H]
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()[None, :, :, None]
        decay = torch.exp(seg.masked_fill(~causal, float("-inf"))) * dtc[:, None, :, :]
        cb = torch.einsum("btgn,bsgn->btsg", Cc, Bc)                       # [b, t, s, G]
        scores = (decay.view(b, L, L, G, k) * cb[..., None])               # [b, t, s, G, k]
        y = torch.einsum("btsgk,bsgkp->btgkp", scores, xc.view(b, L, G, k, P))
        y = y + (torch.einsum("btgn,bgkpn->btgkp", Cc, state)
                 * torch.exp(cs).view(b, L, G, k, 1))
        ys.append(y.reshape(b, L, H, P))
        w = (torch.exp(cs[:, -1:, :] - cs) * dtc)[..., None] * xc          # [b, L, H, P]
        state = (state * torch.exp(cs[:, -1, :]).view(b, G, k, 1, 1)
                 + torch.einsum("bsgkp,bsgn->bgkpn", w.view(b, L, G, k, P), Bc))
    return torch.cat(ys, dim=1), state.reshape(b, H, P, N)


def mup_vector(cfg: FalconH1Config) -> torch.Tensor:
    """Per-channel multipliers of in_proj's output: ssm_multipliers over z, x, B, C, dt."""
    return torch.cat([torch.full((n,), m, dtype=torch.float32)
                      for n, m in zip(cfg.in_proj_split, cfg.ssm_multipliers, strict=True)])


def mixer(h: torch.Tensor, w: dict, cfg: FalconH1Config, mup: torch.Tensor,
          ssm_state: torch.Tensor, conv_state: torch.Tensor) -> torch.Tensor:
    """The Mamba branch for ``h [b, T, hidden]`` (already normed); returns ``[b, T, hidden]``.

    ``ssm_state [b, H, P, N]`` and ``conv_state [b, conv_dim, d_conv - 1]`` are
    read as the state before the tokens and overwritten with the state after
    them. ``T == 1`` takes the one-step recurrence, longer inputs the SSD scan.
    The result is not yet scaled by ``ssm_out_multiplier``.
    """
    b, T, _ = h.shape
    H, P = cfg.mamba_n_heads, cfg.mamba_d_head
    G, N = cfg.mamba_n_groups, cfg.mamba_d_state
    zxbcdt = F.linear(h * cfg.ssm_in_multiplier, w["in_proj.weight"], w.get("in_proj.bias")) * mup
    z, xbc, dt = zxbcdt.split([cfg.mamba_d_ssm, cfg.conv_dim, H], dim=-1)
    xbc, new_conv = causal_conv(xbc, conv_state, w["conv1d.weight"], w.get("conv1d.bias"))
    x, Bm, Cm = xbc.split([cfg.mamba_d_ssm, G * N, G * N], dim=-1)
    x = x.reshape(b, T, H, P)
    Bm, Cm = Bm.reshape(b, T, G, N), Cm.reshape(b, T, G, N)
    dt = F.softplus(dt + w["dt_bias"]).clamp(*cfg.time_step_limit)
    A = -torch.exp(w["A_log"])
    if T == 1:   # decode: update the caller's state where it lies
        y = ssm_step(x[:, 0], dt[:, 0], A, Bm[:, 0], Cm[:, 0], ssm_state, in_place=True)[0][:, None]
    else:
        y, new_state = ssd_scan(x, dt, A, Bm, Cm, ssm_state, cfg.mamba_chunk_size)
        ssm_state.copy_(new_state)
    y = (y + w["D"][:, None] * x).reshape(b, T, cfg.mamba_d_ssm)
    if cfg.mamba_rms_norm:
        y = gated_rms_norm(y, z, w["norm.weight"], cfg.rms_norm_eps, G, cfg.mamba_norm_before_gate)
    else:
        y = y * F.silu(z)
    conv_state.copy_(new_conv)
    return F.linear(y, w["out_proj.weight"], w.get("out_proj.bias"))
