"""Mamba-2's single-token state update, reading and writing the state in its pages.

Per request ``b``, head ``h`` (group ``g = h // (H/G)``), for one decode token::

    dt    = clamp(softplus(dt_raw + dt_bias[h]), lo, hi)
    state = exp(dt * A[h]) * state + dt * x (outer) B[g]        # [P, N]
    y     = state @ C[g] + D[h] * x                             # [P]

(`adapters.torch.mamba.mixer`'s decode step, the gate and norm excepted).
A program owns ``BLOCK_P`` rows of one head's ``[P, N]`` state: it loads them
where they lie, updates them in float32, stores them back in the pool's dtype
and writes its rows of ``y``. Two entry points share the kernel:

* `ssm_update_paged`: the state of every organization in one layer of a pool,
  through `StateTables` (`adapters.torch.kernels.addressing.paged`);
* `ssm_update_dense`: a contiguous ``[b, H, P, N]`` state, no table: the
  baseline the paged kernel is timed against.

`ssm_update_reference` is the same step in torch on a contiguous state; the
tests hold both kernels to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from adapters.torch.kernels import addressing
from adapters.torch.kernels.tables import StateTables
from adapters.torch.mamba import ssm_step


@triton.jit
def _ssm_update(state_ptr, state_stride, table_ptr, table_stride, page_elems,
                x_ptr, x_sb, dt_ptr, dt_sb, dt_bias_ptr, A_ptr, B_ptr, B_sb, C_ptr, C_sb,
                D_ptr, y_ptr, dt_lo, dt_hi,
                H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, HPG: tl.constexpr,
                BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                PAGED: tl.constexpr, ONE_PAGE: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    pm = p < P
    nm = n < N
    mask = pm[:, None] & nm[None, :]
    e = h * (P * N) + p[:, None] * N + n[None, :]
    if PAGED:
        first = h * (P * N) + tl.program_id(2) * BLOCK_P * N
        off, ok = addressing.paged(table_ptr + b * table_stride, e, first, 0, page_elems,
                                   state_stride, mask, ONE_PAGE)
    else:
        off, ok = addressing.direct(b, e, state_stride, mask)
    s = tl.load(state_ptr + off, mask=ok, other=0.0).to(tl.float32)

    g = h // HPG
    x = tl.load(x_ptr + b * x_sb + h * P + p, mask=pm, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + b * dt_sb + h).to(tl.float32) + tl.load(dt_bias_ptr + h).to(tl.float32)
    dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)      # softplus (threshold 20)
    dt = tl.minimum(tl.maximum(dt, dt_lo), dt_hi)
    A = tl.load(A_ptr + h).to(tl.float32)
    Bv = tl.load(B_ptr + b * B_sb + g * N + n, mask=nm, other=0.0).to(tl.float32)
    Cv = tl.load(C_ptr + b * C_sb + g * N + n, mask=nm, other=0.0).to(tl.float32)
    D = tl.load(D_ptr + h).to(tl.float32)

    s = s * tl.exp(dt * A) + (dt * x)[:, None] * Bv[None, :]
    y = tl.sum(s * Cv[None, :], axis=1) + D * x
    tl.store(state_ptr + off, s.to(state_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + (b * H + h) * P + p, y.to(y_ptr.dtype.element_ty), mask=pm)


def _block_p(P: int, N: int) -> int:
    """Rows per program: up to 8,192 state elements, 64 float32 registers per
    thread of a 4-warp program (Falcon-H1-7B: 32 of a head's 128 rows)."""
    return max(1, min(triton.next_power_of_2(P), 8192 // triton.next_power_of_2(N)))


def _launch(state, state_stride, table, table_stride, page_elems, paged, shape, x, dt, A, B, C,
            D, dt_bias, dt_limit):
    b, H, P, N, G = shape
    for name, t in (("x", x), ("dt", dt), ("B", B), ("C", C)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    block_p = _block_p(P, N)
    tile = block_p * N
    one_page = paged and (P * N) % tile == 0 and page_elems % tile == 0
    y = torch.empty(b, H, P, dtype=x.dtype, device=x.device)
    grid = (b, H, triton.cdiv(P, block_p))
    _ssm_update[grid](state, state_stride, table, table_stride, page_elems,
                      x, x.stride(0), dt, dt.stride(0), dt_bias, A, B, B.stride(0), C,
                      C.stride(0), D, y, float(dt_limit[0]), float(dt_limit[1]),
                      H=H, P=P, N=N, HPG=H // G, BLOCK_P=block_p,
                      BLOCK_N=triton.next_power_of_2(N), PAGED=paged, ONE_PAGE=one_page)
    return y


def ssm_update_paged(pool_layer: torch.Tensor, tables: StateTables, x, dt, A, B, C, D, dt_bias,
                     dt_limit=(0.0, float("inf"))) -> torch.Tensor:
    """One decode token for ``b`` requests whose states lie in ``pool_layer``
    (``pool[:, layer]``, ``[pages, page_elems]``) at ``tables.ssm``.

    ``x [b, H, P]``, ``dt [b, H]`` (before ``dt_bias`` and softplus), ``A, D,
    dt_bias [H]``, ``B, C [b, G, N]``; returns ``y [b, H, P]``, the state
    updated in place.
    """
    b, H, P = x.shape
    G, N = B.shape[1:]
    if pool_layer.stride(-1) != 1 or tables.batch != b:
        raise ValueError("the pool layer must be contiguous per page and the tables one row "
                         "per request")
    return _launch(pool_layer, pool_layer.stride(0), tables.ssm, tables.ssm.stride(0),
                   tables.page_elems, True, (b, H, P, N, G), x.reshape(b, H * P),
                   dt, A, B.reshape(b, G * N), C.reshape(b, G * N), D, dt_bias, dt_limit)


def ssm_update_dense(state: torch.Tensor, x, dt, A, B, C, D, dt_bias,
                     dt_limit=(0.0, float("inf"))) -> torch.Tensor:
    """`ssm_update_paged` on a contiguous ``state [b, H, P, N]`` (updated in place)."""
    b, H, P = x.shape
    G, N = B.shape[1:]
    if not state.is_contiguous():
        raise ValueError("the dense state must be contiguous")
    return _launch(state, H * P * N, state, 0, 1, False, (b, H, P, N, G), x.reshape(b, H * P),
                   dt, A, B.reshape(b, G * N), C.reshape(b, G * N), D, dt_bias, dt_limit)


def ssm_update_reference(state: torch.Tensor, x, dt, A, B, C, D, dt_bias,
                         dt_limit=(0.0, float("inf"))) -> torch.Tensor:
    """The torch engine's decode step (`adapters.torch.mamba.ssm_step`) in float32
    on a contiguous ``state [b, H, P, N]``, written back in its dtype."""
    dt = F.softplus(dt.float() + dt_bias.float()).clamp(*dt_limit)
    s = state.float()
    y, s = ssm_step(x.float(), dt, A.float(), B.float(), C.float(), s)
    state.copy_(s)
    return (y + D.float()[:, None] * x.float()).to(x.dtype)
