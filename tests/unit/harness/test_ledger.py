"""Ledger: allocation arithmetic of DESIGN.md section 3, break-even, D0 feasibility, tail waste."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import HbenchError
from harness.budget import resolve_budget
from harness.ledger import (
    WASTE_KINDS,
    allocation,
    allocation_bytes,
    break_even_ratio,
    d0_feasibility,
    delta01_kib,
    kv_budget_bytes,
    kv_tokens_for,
    mean_tail_waste_whole_pages,
    tail_waste_summary,
    tail_waste_tokens,
)
from harness.model_configs import from_config, load_config, preset
from harness.orgs import ORGANIZATIONS, layout_for
from tests.support import FIXTURES

GEOM = preset("falcon-h1-7b")
FIX = FIXTURES / "configs"


def alloc(org, x_a, x_r, geom=GEOM, **kw):
    return allocation(org, layout_for(org, geom), x_a, x_r, **kw)


def test_worked_example_matches_the_section_3_formulas():
    x_a, x_r = 16, 4
    assert alloc("s0", x_a, x_r)["allocated_kib"] == 1557 * (x_a + x_r) == 31_140
    assert alloc("s1", x_a, x_r)["allocated_kib"] == 512 * x_a + 2048 * x_r == 16_384
    s2 = alloc("s2", x_a, x_r)
    assert s2["allocated_kib"] == 512 * x_a + 1536 * x_r + 512 * math.ceil(x_r / 16) == 14_848
    assert s2["slabs"] == 1


def test_waste_breakdown_by_kind_for_the_worked_example():
    assert alloc("s0", 16, 4)["waste_kib"]["attention"] == 1045 * 16
    assert alloc("s1", 16, 4)["waste_kib"]["conv"] == (512 - 21) * 4
    w = alloc("s2", 16, 4)["waste_kib"]
    assert (w["conv"], w["slab_spare"]) == ((32 - 21) * 4, (16 - 4) * 32)
    assert all(v == 0 for v in alloc("d0", 512, 4)["waste_kib"].values())
    assert alloc("d0", 512, 4)["allocated_kib"] == 16 * 512 + 1557 * 4


@given(st.integers(0, 5000), st.integers(0, 500), st.sampled_from(list(ORGANIZATIONS)))
def test_allocated_is_logical_plus_waste(x_a, x_r, org):
    b = allocation_bytes(org, layout_for(org, GEOM), x_a, x_r)
    assert b["allocated"] == b["logical"] + sum(b["waste"].values())
    assert set(b["waste"]) == set(WASTE_KINDS)


def test_s2_with_extra_slabs_pays_for_them_and_too_few_is_an_error():
    assert alloc("s2", 0, 4, slabs=2)["allocated_kib"] == 1536 * 4 + 512 * 2
    with pytest.raises(HbenchError, match="fewer than the 17 checkpoints"):
        alloc("s2", 0, 17, slabs=1)


def test_break_even_ratio_is_491_over_1045():
    assert break_even_ratio(GEOM) == pytest.approx(491 / 1045)
    assert round(break_even_ratio(GEOM), 2) == 0.47


@pytest.mark.parametrize("x_a, x_r", [(16, 4), (0, 10), (47, 100), (48, 100), (1, 0)])
def test_delta01_is_s0_minus_s1_and_matches_the_closed_form(x_a, x_r):
    c_kib, a_kib = 1557, 512
    closed = (c_kib - a_kib) * x_a - (math.ceil(c_kib / a_kib) * a_kib - c_kib) * x_r
    assert delta01_kib(GEOM, x_a, x_r) == closed
    assert closed == alloc("s0", x_a, x_r)["allocated_kib"] - alloc("s1", x_a, x_r)["allocated_kib"]
    assert (closed > 0) == (x_a > break_even_ratio(GEOM) * x_r)


def test_d0_feasibility_checks_each_pool_separately():
    b = resolve_budget("b83", layout_for("d0", GEOM), GEOM)  # 4038 attention blocks, 41 checkpoint units
    assert d0_feasibility(b, 4038, 41)["feasible"]
    over_a = d0_feasibility(b, 4039, 0)
    assert not over_a["feasible"] and not over_a["attention_fits"] and over_a["checkpoint_fits"]
    over_r = d0_feasibility(b, 0, 42)
    assert not over_r["feasible"] and over_r["attention_fits"]
    assert over_r["checkpoint_need_kib"] == 1557 * 42
    assert over_r["checkpoint_capacity_kib"] == 1557 * 41
    with pytest.raises(HbenchError, match="needs a d0 budget"):
        d0_feasibility(resolve_budget("b83", layout_for("s2", GEOM), GEOM), 1, 1)


@pytest.mark.parametrize("x_a, x_r", [(-1, 0), (0, -2), (1.5, 0), (True, 0)])
def test_negative_or_non_integer_counts_are_errors(x_a, x_r):
    with pytest.raises(HbenchError, match="non-negative integer"):
        alloc("s1", x_a, x_r)


def test_tail_waste_example():
    assert tail_waste_tokens([1, 512, 513, 0, 1000], 512) == [511, 0, 511, 0, 24]
    with pytest.raises(HbenchError, match="non-negative integers"):
        tail_waste_tokens([5, -1], 16)


@given(st.lists(st.integers(1, 100_000), max_size=50), st.sampled_from([1, 16, 512, 1000]))
def test_tail_waste_is_below_one_block_and_completes_a_block(lengths, block):
    for n, w in zip(lengths, tail_waste_tokens(lengths, block), strict=True):
        assert 0 <= w <= block - 1
        assert (n + w) % block == 0


@pytest.mark.parametrize("block", [1, 2, 16, 512])
@pytest.mark.parametrize("pages", [1, 3])
def test_mean_tail_waste_over_whole_pages_is_half_a_block(block, pages):
    assert mean_tail_waste_whole_pages(block, pages) == (block - 1) / 2


def test_tail_waste_summary_uses_each_orgs_block_size():
    s = tail_waste_summary([100, 3332], GEOM)
    assert s["s2"]["tokens"] == 412 + (7 * 512 - 3332)
    assert s["d0"]["tokens"] == 12 + (209 * 16 - 3332)
    assert s["d0"]["kib"] == s["d0"]["tokens"]  # 1 KiB per token per layer


def test_pure_attention_kv_budget():
    llama = from_config(load_config(FIX / "llama.json"))
    assert kv_budget_bytes(llama, 1000) == 2 * 32 * 8 * 128 * 2 * 1000
    assert kv_tokens_for(llama, 2**30) == 2**30 // (2 * 32 * 8 * 128 * 2)
    # no SSM state: the geometry rule's smallest page, 16 tokens of 4 KiB (2 x 8 x 128 x 2 B)
    assert alloc("s1", 4, 0, geom=llama)["allocated_kib"] == 4 * 16 * 4
    with pytest.raises(HbenchError, match="no recurrent state"):
        alloc("s1", 4, 1, geom=llama)
