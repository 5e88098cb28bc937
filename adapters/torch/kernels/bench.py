"""Per-layer timing of the state kernels: paged (each organization's layout) against dense.

For one layer of a model geometry and a batch of ``b`` requests, `time_layer`
lays the batch's states over a one-layer pool the way ``org`` does (pages in
a random order, S2's conv slots packed into slabs, `layout_placements`),
then times the SSM and conv updates reading them through page tables, and
the same kernels on contiguous ``[b, ...]`` states (the baseline). Bytes
moved are the states read and written (the inputs and outputs are a few KiB);
`copy_bandwidth` measures what a plain device copy achieves, the yardstick.
"""

from __future__ import annotations

import math
import time

import torch

from adapters.torch.kernels.conv_update import conv_update_dense, conv_update_paged
from adapters.torch.kernels.ssm_update import ssm_update_dense, ssm_update_paged
from adapters.torch.kernels.tables import build_tables
from harness.orgs.values import ConvInline, ConvPages, ConvSlot, StatePlacement


def layout_placements(layout, b: int, unit: int, gen: torch.Generator):
    """``b`` states laid out as ``layout`` (a `harness.layout.OrgLayout`) on
    randomly ordered pages of one pool; returns (placements, pages)."""
    page, ssm = layout.ckpt_page_bytes, layout.ssm_bytes
    if layout.checkpoint_is_one_unit:
        order = torch.randperm(b, generator=gen).tolist()
        return [StatePlacement(0, ((p, ssm),), ConvInline(p, ssm)) for p in order], b
    members = layout.ssm_pages
    per = members + (0 if layout.conv_slots else layout.conv_pages)
    slabs = math.ceil(b / layout.slab_slots) if layout.conv_slots else 0
    pages = b * per + slabs
    order = torch.randperm(pages, generator=gen).tolist()
    slab_pages, order = order[:slabs], order[slabs:]
    out = []
    for r in range(b):
        mine = order[r * per:(r + 1) * per]
        parts = tuple((p, min(page, ssm - i * page)) for i, p in enumerate(mine[:members]))
        if layout.conv_slots:
            conv = ConvSlot(slab_pages[r // layout.slab_slots], r % layout.slab_slots,
                            layout.slot_bytes)
        else:
            conv = ConvPages(tuple(mine[members:]), layout.conv_bytes)
        out.append(StatePlacement(0, parts, conv))
    return out, pages


def _timer(device: torch.device, fn, reps: int) -> float:
    """Median seconds of ``fn()`` over ``reps`` runs (after one warm-up run)."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(device, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Bytes per second (read + write) of one device-to-device copy of ``nbytes``."""
    device = torch.device(device)
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / _timer(device, lambda: dst.copy_(src), reps)


def time_layer(org_layout, dims: dict, b: int, device, dtype=torch.bfloat16, reps: int = 20,
               unit: int = 2, seed: int = 0) -> dict:
    """Median per-layer times (s) of the paged and dense SSM and conv updates.

    ``dims``: ``H, P, N, G, C, W`` (heads, head dim, state, groups, conv
    channels, conv width ``d_conv - 1``)."""
    device = torch.device(device)
    H, P, N, G, C, W = (dims[k] for k in ("H", "P", "N", "G", "C", "W"))
    gen = torch.Generator().manual_seed(seed)
    placements, pages = layout_placements(org_layout, b, unit, gen)
    page_elems = org_layout.ckpt_page_bytes // unit
    pool = (torch.randn(pages, 1, page_elems, generator=gen) * 0.1).to(device, dtype)
    tables = build_tables(placements, org_layout.ckpt_page_bytes, unit, H * P * N, C * W, device)
    layer = pool[:, 0]

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    x, dt, B, Cm = r(b, H, P), r(b, H), r(b, G, N, scale=0.1), r(b, G, N, scale=0.1)
    A, D, dt_bias = -torch.rand(H, generator=gen).to(device) - 0.5, r(H), r(H)
    xc, weight, bias = r(b, C), r(C, 1, W + 1, scale=0.5), r(C)
    dense_ssm, dense_conv = r(b, H, P, N, scale=0.1), r(b, C, W, scale=0.1)
    out = {
        "ssm_paged_s": _timer(device, lambda: ssm_update_paged(
            layer, tables, x, dt, A, B, Cm, D, dt_bias), reps),
        "ssm_dense_s": _timer(device, lambda: ssm_update_dense(
            dense_ssm, x, dt, A, B, Cm, D, dt_bias), reps),
        "conv_paged_s": _timer(device, lambda: conv_update_paged(layer, tables, xc, weight, bias),
                               reps),
        "conv_dense_s": _timer(device, lambda: conv_update_dense(dense_conv, xc, weight, bias),
                               reps),
    }
    esize = torch.tensor([], dtype=dtype).element_size()
    out["ssm_bytes"] = 2 * b * H * P * N * esize          # state read and written
    out["conv_bytes"] = 2 * b * C * W * esize
    return out
