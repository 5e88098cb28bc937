"""How an organization splits one byte target into its pools.

As vLLM picks a manager class per kind of cache spec (``spec_manager_map``),
each organization names the kind of split it makes (its ``pool_split``), and
the budget asks that split instead of reading the layout's flags:

    SharedPages   one pool of the organization's pages           (s0, s1, s2)
    DualPools     an attention pool of whole blocks of f x bytes,
                  the rest in checkpoint units                     (d0, e0)
    OneRegion     one region of whole attention pages, split
                  between its two ends while serving               (u0)

A split works in the layout's paging: the study's pages, or vLLM's blocks, of
which block 0 is vLLM's null block and belongs to no pool (harness/budget.py
derives each case's page counts for Falcon-H1-7B). The bytes of each pool's
target sum to the budget's target; what no whole page fits is that pool's
rounding loss. Each range the splits take is checked once, here
(`check_attn_fraction`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import HbenchError
from harness.layout import VLLM_PAGINGS, OrgLayout


def check_attn_fraction(fraction: float, name: str = "--d0-attn-fraction") -> float:
    """``fraction`` if it is a share of a dual-pool budget strictly between 0
    and 1; else HbenchError naming it as ``name`` (a flag, or the variable
    that carried it)."""
    if not 0.0 < fraction < 1.0:
        raise HbenchError(f"{name} must be in (0, 1), got {fraction}")
    return fraction


@dataclass(frozen=True)
class PoolCapacity:
    """One pool of one organization: what it was given and what that buys."""

    name: str  # "shared" (S0/S1/S2), "attention" / "checkpoint" (D0, E0), "region" (U0)
    page_bytes: int  # bytes per page per pool layer
    pages: int  # integer page count
    target_bytes: int  # bytes this pool was given (per pool layer)

    @property
    def rounding_loss_bytes(self) -> int:
        """Bytes of the target no whole page fits in."""
        return self.target_bytes - self.pages * self.page_bytes


def vllm_d0_split(blocks: int, attn_fraction: float) -> tuple[int, int]:
    """(attention blocks, checkpoint blocks) of D0 in ``blocks`` vLLM blocks:
    block 0 is vLLM's null block and belongs to neither pool; the rest is
    split by ``attn_fraction`` (floored for attention), each pool at least 1."""
    usable = blocks - 1
    if usable < 2:
        raise HbenchError(f"d0 needs at least 3 vLLM blocks (the null block and one per pool); "
                          f"the budget gives {blocks}: raise the budget")
    attn = min(max(1, math.floor(attn_fraction * usable)), usable - 1)
    return attn, usable - attn


class PoolSplit:
    """One kind of split: `pools` turns a target (bytes per pool layer) into
    this organization's pools under ``layout``'s paging, or refuses
    (HbenchError) a target that cannot hold one request's state."""

    #: pool sizes an organization of this split is built from
    pool_count = 1
    #: whether the split keeps recurrent state in a pool of its own, so a
    #: model without recurrent state has nothing to give it
    needs_state = False
    #: whether the split takes an attention fraction (recorded with the budget)
    takes_fraction = False

    def label_page_bytes(self, layout: OrgLayout, geom, grid) -> int:
        """The page an ``Np`` budget label counts, from the organization's
        study ``layout`` on ``grid`` (a `harness.layout.Grid`): the shared
        attention page A of that grid."""
        return grid.shared_block_tokens * geom.slot_attn_bytes_per_token

    def pools(self, target: int, label: str, layout: OrgLayout, geom,
              fraction: float) -> tuple[PoolCapacity, ...]:
        if layout.paging in VLLM_PAGINGS:
            return self.in_vllm_blocks(target, label, layout, fraction,
                                       target // layout.attn_page_bytes)
        return self.in_pages(target, label, layout, geom, fraction)

    def in_pages(self, target: int, label: str, layout: OrgLayout, geom,
                 fraction: float) -> tuple[PoolCapacity, ...]:
        """The pools in the study's pages of ``layout`` (for model ``geom``)."""
        raise NotImplementedError

    def in_vllm_blocks(self, target: int, label: str, layout: OrgLayout, fraction: float,
                       blocks: int) -> tuple[PoolCapacity, ...]:
        """``blocks``: the target in whole vLLM blocks, the null block included;
        the null block is counted with the first pool's rounding loss."""
        raise NotImplementedError


class SharedPages(PoolSplit):
    """One pool of the organization's own pages: floor(bytes / page)."""

    def label_page_bytes(self, layout: OrgLayout, geom, grid) -> int:
        return layout.attn_page_bytes

    def in_pages(self, target, label, layout, geom, fraction):
        page = layout.attn_page_bytes
        shared = PoolCapacity("shared", page, target // page, target)
        _check_one_request(layout, label, shared.pages)
        return (shared,)

    def in_vllm_blocks(self, target, label, layout, fraction, blocks):
        page = layout.attn_page_bytes
        if blocks < 1:
            raise HbenchError(f"budget {label} is smaller than one vLLM block of "
                              f"{page:,} B per pool layer: raise the budget")
        _check_one_request(layout, label, blocks - 1)
        return (PoolCapacity("shared", page, blocks - 1, target),)


class DualPools(PoolSplit):
    """An attention pool of whole blocks of floor(f x bytes); every byte it
    cannot use goes to the checkpoint pool, so the loss is under one C."""

    pool_count = 2
    needs_state = True
    takes_fraction = True

    def in_pages(self, target, label, layout, geom, fraction):
        check_attn_fraction(fraction)
        if layout.ckpt_page_bytes == 0:
            raise HbenchError(f"{layout.org} keeps a checkpoint pool, but {geom.name} has no "
                              "recurrent state")
        blocks = math.floor(fraction * target) // layout.attn_page_bytes
        m_a = blocks * layout.attn_page_bytes
        attn = PoolCapacity("attention", layout.attn_page_bytes, blocks, m_a)
        ckpt = PoolCapacity("checkpoint", layout.ckpt_page_bytes,
                            (target - m_a) // layout.ckpt_page_bytes, target - m_a)
        if attn.pages < 1 or ckpt.pages < 1:
            raise HbenchError(
                f"budget {label} with d0 attention fraction {fraction} gives "
                f"{attn.pages} attention blocks and {ckpt.pages} checkpoint units; "
                "each pool must hold at least one: raise the budget or change the fraction")
        return attn, ckpt

    def in_vllm_blocks(self, target, label, layout, fraction, blocks):
        check_attn_fraction(fraction)
        page = layout.attn_page_bytes
        attn, ckpt = vllm_d0_split(blocks, fraction)
        return (PoolCapacity("attention", page, attn, target - ckpt * page),
                PoolCapacity("checkpoint", page, ckpt, ckpt * page))


class OneRegion(PoolSplit):
    """One region of floor(bytes / A16) attention pages' bytes, which the
    organization splits between its two ends while serving."""

    needs_state = True

    def in_pages(self, target, label, layout, geom, fraction):
        region = PoolCapacity("region", layout.attn_page_bytes,
                              target // layout.attn_page_bytes, target)
        need = layout.attn_page_bytes + layout.ckpt_page_bytes   # one block and one checkpoint
        if region.pages * layout.attn_page_bytes < need:
            raise HbenchError(f"budget {label} gives {layout.org} a region of {region.pages} "
                              f"pages of {layout.attn_page_bytes:,} B; one request needs "
                              f"{need:,} B (an attention block and a checkpoint): raise the budget")
        return (region,)

    def in_vllm_blocks(self, target, label, layout, fraction, blocks):
        if blocks < 3:
            raise HbenchError(f"{layout.org} needs at least 3 vLLM blocks (the null block, one "
                              f"per end of its region); the budget gives {blocks}: raise the budget")
        return (PoolCapacity("region", layout.attn_page_bytes, blocks - 1, target),)


def _check_one_request(layout: OrgLayout, label: str, pages: int) -> None:
    need = 1 + layout.ckpt_pages + (1 if layout.conv_slots else 0)  # attention + checkpoint (+slab)
    if pages < need:
        raise HbenchError(f"budget {label} gives {layout.org} {pages} pages; one request needs "
                          f"{need} (an attention block and a checkpoint): raise the budget")
