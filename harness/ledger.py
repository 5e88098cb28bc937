"""The allocation ledger: what a logical state mix costs each organization.

Pure functions over an `OrgLayout` (DESIGN.md section 3). A state mix is
``x_a`` attention blocks (of the organization's own block size: 512 tokens
for S0/S1/S2, 16 for D0) and ``x_r`` checkpoints. Per pool layer, in KiB,
for Falcon-H1-7B (A = 512, C = 1557):

    S0  1557 (x_A + x_R)
    S1  512 x_A + 2048 x_R
    S2  512 x_A + 1536 x_R + 512 m,  m = ceil(x_R / 16) slabs
    D0  16 x_A16 + 1557 x_R, feasible iff each pool holds its part

Worked example x_A = 16, x_R = 4: S0 31,140; S1 16,384; S2 14,848.

Allocated bytes = logical bytes + waste, with waste split by kind:

    attention   page bytes an attention block leaves unused (S0: 1045 KiB)
    checkpoint  page bytes a one-page checkpoint leaves unused (S0)
    ssm         SSM member pages beyond the SSM state (S1/S2)
    conv        conv page (S1) or slot (S2) beyond the conv state
    slab_spare  unused slots of the S2 slabs allocated

Token-level page-tail waste (a request's last, partly filled block) is a
property of request lengths, computed by `tail_waste_tokens`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from common.errors import HbenchError
from harness.budget import OrgBudget
from harness.geometry import KIB, ModelGeometry
from harness.layout import OrgLayout
from harness.orgs import ORGANIZATIONS, layout_for

WASTE_KINDS = ("attention", "checkpoint", "ssm", "conv", "slab_spare")


def kib(nbytes: int) -> int | float:
    """Bytes in KiB: an int when exact (Falcon-H1's sizes all are), else a float."""
    return nbytes // KIB if nbytes % KIB == 0 else nbytes / KIB


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise HbenchError(f"{name} must be a non-negative integer, got {value!r}")


def allocation_bytes(org: str, layout: OrgLayout, x_a: int, x_r: int,
                     slabs: int | None = None) -> dict:
    """Bytes ``org`` allocates for ``x_a`` attention blocks and ``x_r`` checkpoints.

    ``slabs`` (S2 only) is the number of conv slabs actually allocated; the
    default is the fewest that hold ``x_r`` slots, ceil(x_r / slots per slab).
    """
    _check_counts(x_a=x_a, x_r=x_r)
    if org != layout.org:
        raise HbenchError(f"layout is {layout.org}'s, not {org}'s")
    if x_r and not layout.checkpoint_bytes:
        raise HbenchError(f"x_r = {x_r} checkpoints, but the model has no recurrent state")
    waste = dict.fromkeys(WASTE_KINDS, 0)
    page = layout.ckpt_page_bytes
    m = 0
    if layout.checkpoint_is_one_unit:
        # one page (S0) or one contiguous unit (D0) per attention block / checkpoint
        allocated = x_a * layout.attn_page_bytes + x_r * page
        waste["attention"] = x_a * (layout.attn_page_bytes - layout.attn_block_bytes)
        waste["checkpoint"] = x_r * (page - layout.checkpoint_bytes)
    else:
        allocated = x_a * layout.attn_page_bytes + x_r * layout.ckpt_pages * page
        waste["attention"] = x_a * (layout.attn_page_bytes - layout.attn_block_bytes)
        waste["ssm"] = x_r * (layout.ssm_pages * page - layout.ssm_bytes)
        if layout.conv_slots:
            m = math.ceil(x_r / layout.slab_slots) if slabs is None else slabs
            _check_counts(slabs=m)
            if m * layout.slab_slots < x_r:
                raise HbenchError(f"{m} slabs hold {m * layout.slab_slots} conv slots, "
                                  f"fewer than the {x_r} checkpoints")
            allocated += m * page
            waste["conv"] = x_r * (layout.slot_bytes - layout.conv_bytes)
            waste["slab_spare"] = (m * layout.slab_slots - x_r) * layout.slot_bytes
        else:
            waste["conv"] = x_r * (layout.conv_pages * page - layout.conv_bytes)
    logical = x_a * layout.attn_block_bytes + x_r * layout.checkpoint_bytes
    assert allocated == logical + sum(waste.values()), (org, allocated, logical, waste)
    return {"org": org, "x_a": x_a, "x_r": x_r, "slabs": m, "allocated": allocated,
            "logical": logical, "waste": waste}


def allocation(org: str, layout: OrgLayout, x_a: int, x_r: int, slabs: int | None = None) -> dict:
    """`allocation_bytes` in KiB per pool layer: allocated, logical and waste by kind."""
    b = allocation_bytes(org, layout, x_a, x_r, slabs)
    return {
        "org": org, "x_a": x_a, "x_r": x_r, "slabs": b["slabs"],
        "attn_block_tokens": layout.attn_block_tokens,
        "allocated_kib": kib(b["allocated"]),
        "logical_kib": kib(b["logical"]),
        "waste_kib": {k: kib(v) for k, v in b["waste"].items()},
    }


def delta01_kib(geom: ModelGeometry, x_a: int, x_r: int) -> int | float:
    """S0 minus S1 allocation in KiB: positive means S1 uses less memory.

    Closed form (P0 = S0 page = max(A, C), k1 = pages of an S1 checkpoint,
    = ceil(C/A) when the SSM state fills whole pages, as for Falcon-H1):
    Delta01 = (P0 - A) x_A - (k1 A - P0) x_R.
    """
    _check_counts(x_a=x_a, x_r=x_r)
    s0, s1 = layout_for("s0", geom), layout_for("s1", geom)
    p0, a = s0.attn_page_bytes, s1.attn_page_bytes
    k1 = s1.ckpt_pages
    ckpt_term = (k1 * a - p0) * x_r if geom.slot_checkpoint_bytes else 0
    return kib((p0 - a) * x_a - ckpt_term)


def break_even_ratio(geom: ModelGeometry) -> float | None:
    """S1 beats S0 iff x_A > ratio x x_R; ratio = (k1 A - C) / (C - A).

    Falcon-H1-7B: (4 x 512 - 1557) / (1557 - 512) = 491 / 1045 = 0.47.
    None when the S0 page is no larger than A (S0 has no attention waste to win back).
    """
    s0, s1 = layout_for("s0", geom), layout_for("s1", geom)
    p0, a = s0.attn_page_bytes, s1.attn_page_bytes
    if p0 <= a:
        return None
    return (s1.ckpt_pages * a - p0) / (p0 - a)


def d0_feasibility(budget: OrgBudget, x_a16: int, x_r: int) -> dict:
    """Whether D0's two pools hold ``x_a16`` 16-token blocks and ``x_r`` checkpoints.

    16 x x_A16 <= M_A and 1557 x x_R <= M_R (KiB, Falcon-H1-7B); free space in
    one pool never serves the other.
    """
    _check_counts(x_a16=x_a16, x_r=x_r)
    if budget.org != "d0":
        raise HbenchError(f"D0 feasibility needs a d0 budget, got {budget.org}'s")
    attn, ckpt = budget.pool("attention"), budget.pool("checkpoint")
    need_a, need_r = x_a16 * attn.page_bytes, x_r * ckpt.page_bytes
    cap_a, cap_r = attn.pages * attn.page_bytes, ckpt.pages * ckpt.page_bytes
    return {
        "x_a16": x_a16, "x_r": x_r,
        "attention_need_kib": kib(need_a), "attention_capacity_kib": kib(cap_a),
        "checkpoint_need_kib": kib(need_r), "checkpoint_capacity_kib": kib(cap_r),
        "attention_fits": need_a <= cap_a, "checkpoint_fits": need_r <= cap_r,
        "feasible": need_a <= cap_a and need_r <= cap_r,
    }


def tail_waste_tokens(lengths: Iterable[int], block_tokens: int) -> list[int]:
    """Per request, the unused token slots of its last block: ceil(L/B) B - L.

    An empty request (L = 0) holds no block and wastes nothing; any other
    wastes at most B - 1 slots.
    """
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise HbenchError(f"block size must be a positive integer, got {block_tokens!r}")
    out = []
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise HbenchError(f"request lengths must be non-negative integers, got {n!r}")
        out.append(-n % block_tokens)
    return out


def tail_waste_summary(lengths: list[int], geom: ModelGeometry) -> dict:
    """Page-tail waste of ``lengths`` for each organization's attention block size.

    Tokens x attention bytes per token per pool layer, in KiB; S0's waste
    excludes the fixed per-page waste `allocation` already reports.
    """
    out = {}
    per_token = geom.slot_attn_bytes_per_token
    for org in ORGANIZATIONS:
        block = layout_for(org, geom).attn_block_tokens
        waste = tail_waste_tokens(lengths, block)
        out[org] = {"block_tokens": block, "requests": len(waste), "tokens": sum(waste),
                    "max_tokens": max(waste, default=0), "kib": kib(sum(waste) * per_token)}
    return out


def mean_tail_waste_whole_pages(block_tokens: int, pages: int) -> float:
    """Mean tail waste over lengths uniform on 1 .. pages x B: exactly (B - 1) / 2.

    Each page-sized stretch of lengths kB+1 .. (k+1)B wastes B-1, B-2, ..., 0,
    which averages (B - 1) / 2; enumerated here so a test can check it.
    """
    if pages < 1:
        raise HbenchError(f"pages must be >= 1, got {pages}")
    waste = tail_waste_tokens(range(1, pages * block_tokens + 1), block_tokens)
    return sum(waste) / len(waste)


def kv_budget_bytes(geom: ModelGeometry, retained_tokens: int) -> int:
    """Whole-model KV bytes of ``retained_tokens`` tokens:
    2 x attention layers x kv_heads x head_dim x dtype bytes x tokens."""
    _check_counts(retained_tokens=retained_tokens)
    return geom.model_attn_bytes_per_token * retained_tokens


def kv_tokens_for(geom: ModelGeometry, whole_model_bytes: int) -> int:
    """Tokens of KV a whole-model byte budget holds (pure-attention view)."""
    return whole_model_bytes // geom.model_attn_bytes_per_token
