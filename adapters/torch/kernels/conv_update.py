"""The causal depthwise conv's decode update, reading and writing the conv state in place.

Per request ``b`` and channel ``c``, with the conv state ``s [C, W]`` (the
last ``W = d_conv - 1`` inputs) and the weights ``w [C, W + 1]``::

    out[c] = silu(sum_k w[c, k] s[c, k] + w[c, W] x[c] + bias[c])
    s[c]   = (s[c, 1], ..., s[c, W - 1], x[c])

(`adapters.torch.mamba.causal_conv` for one token). A program owns
``BLOCK_C`` channels of one request: it loads their state and its shift by
one where they lie, then stores the shifted state and its outputs. Where the
state lies is the organization's: `conv_update_paged` takes `StateTables`
(inline after the SSM state for S0/D0, own pages for S1, a slot row of a slab
for S2; `NO_STATE` reads a zero history and writes nothing), and
`conv_update_dense` a contiguous ``[b, C, W]`` state, the baseline.
`conv_update_reference` is the torch step the kernels are tested against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adapters.torch.kernels import addressing
from adapters.torch.kernels.tables import PAGES, SLOT, StateTables
from adapters.torch.mamba import causal_conv

DIRECT = 0


@triton.jit
def _conv_address(table_ptr, b, table_stride, e, mask, state_stride, page_elems, conv_base,
                  slots, slot_elems, MODE: tl.constexpr):
    if MODE == 1:       # PAGES
        off, ok = addressing.paged(table_ptr + b * table_stride, e, 0, conv_base, page_elems,
                                   state_stride, mask, False)
    elif MODE == 2:     # SLOT
        off, ok = addressing.slot_row(table_ptr + b * table_stride, e, slots, slot_elems,
                                      state_stride, mask)
    else:               # DIRECT
        off, ok = addressing.direct(b, e, state_stride, mask)
    return off, ok


@triton.jit
def _conv_update(state_ptr, state_stride, table_ptr, table_stride, page_elems, conv_base,
                 slots, slot_elems, x_ptr, x_sb, w_ptr, bias_ptr, out_ptr, n_channels,
                 W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
                 MODE: tl.constexpr, HAS_BIAS: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    k = tl.arange(0, BLOCK_W)
    cm = c < n_channels
    mask = cm[:, None] & (k < W)[None, :]
    e = c[:, None] * W + k[None, :]
    off, ok = _conv_address(table_ptr, b, table_stride, e, mask, state_stride, page_elems,
                            conv_base, slots, slot_elems, MODE)
    nmask = cm[:, None] & (k < W - 1)[None, :]
    noff, nok = _conv_address(table_ptr, b, table_stride, e + 1, nmask, state_stride,
                              page_elems, conv_base, slots, slot_elems, MODE)
    hist = tl.load(state_ptr + off, mask=ok, other=0.0).to(tl.float32)
    nxt = tl.load(state_ptr + noff, mask=nok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + b * x_sb + c, mask=cm, other=0.0).to(tl.float32)

    w_hist = tl.load(w_ptr + c[:, None] * (W + 1) + k[None, :], mask=mask, other=0.0)
    w_last = tl.load(w_ptr + c * (W + 1) + W, mask=cm, other=0.0).to(tl.float32)
    acc = tl.sum(hist * w_hist.to(tl.float32), axis=1) + w_last * x
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=cm, other=0.0).to(tl.float32)
    out = acc / (1.0 + tl.exp(-acc))                                   # silu
    shifted = tl.where((k == W - 1)[None, :], x[:, None], nxt)
    tl.store(state_ptr + off, shifted.to(state_ptr.dtype.element_ty), mask=ok)
    tl.store(out_ptr + b * n_channels + c, out.to(out_ptr.dtype.element_ty), mask=cm)


def _launch(state, state_stride, table, mode, sizes, x, weight, bias):
    page_elems, conv_base, slots, slot_elems = sizes
    b, C = x.shape
    W = weight.shape[-1] - 1
    if x.stride(-1) != 1:
        raise ValueError("x must be contiguous in its last dimension")
    w = weight.reshape(C, W + 1).contiguous()
    out = torch.empty(b, C, dtype=x.dtype, device=x.device)
    block_c = min(256, triton.next_power_of_2(C))
    grid = (b, triton.cdiv(C, block_c))
    _conv_update[grid](state, state_stride, table, table.stride(0) if table.dim() else 0,
                       page_elems, conv_base, slots, slot_elems, x, x.stride(0), w,
                       bias if bias is not None else w, out, C,
                       W=W, BLOCK_C=block_c, BLOCK_W=triton.next_power_of_2(W), MODE=mode,
                       HAS_BIAS=bias is not None)
    return out


def conv_update_paged(pool_layer: torch.Tensor, tables: StateTables, x: torch.Tensor,
                      weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """SiLU(conv) of one token ``x [b, C]`` for requests whose conv states lie in
    ``pool_layer`` (``pool[:, layer]``) at ``tables.conv``; ``weight [C, 1, W+1]``
    (conv1d's). Returns ``[b, C]``; the states are shifted in place."""
    if pool_layer.stride(-1) != 1 or tables.batch != x.shape[0]:
        raise ValueError("the pool layer must be contiguous per page and the tables one row "
                         "per request")
    if tables.conv_mode not in (PAGES, SLOT):
        raise ValueError(f"unknown conv addressing mode {tables.conv_mode}")
    return _launch(pool_layer, pool_layer.stride(0), tables.conv, tables.conv_mode,
                   (tables.page_elems, tables.conv_base, max(tables.slots, 1),
                    tables.slot_elems), x, weight, bias)


def conv_update_dense(state: torch.Tensor, x, weight, bias) -> torch.Tensor:
    """`conv_update_paged` on a contiguous ``state [b, C, W]`` (updated in place)."""
    if not state.is_contiguous():
        raise ValueError("the dense state must be contiguous")
    return _launch(state, state.shape[1] * state.shape[2], state, DIRECT, (1, 0, 1, 0), x,
                   weight, bias)


def conv_update_reference(state: torch.Tensor, x, weight, bias) -> torch.Tensor:
    """`adapters.torch.mamba.causal_conv` for one token in float32 on a contiguous
    ``state [b, C, W]``, written back in its dtype."""
    out, new = causal_conv(x.float()[:, None], state.float(), weight.float(),
                           None if bias is None else bias.float())
    state.copy_(new)
    return out[:, 0].to(x.dtype)
