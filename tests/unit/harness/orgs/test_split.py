"""The pool splits (harness.orgs.split): each pool's bytes sum to the target,
and page counts are the hand-derived ones on tiny made-up layouts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from common.errors import HbenchError
from harness.layout import Grid, OrgLayout, grid_for
from harness.model_configs import preset
from harness.orgs import ORGANIZATIONS, build_organization, layout_for, pool_split
from harness.orgs.split import (
    DualPools,
    OneRegion,
    PoolSplit,
    SharedPages,
    check_attn_fraction,
    vllm_d0_split,
)

# a model that declares a 512-token shared page (as the study's preset does)
GEOM = SimpleNamespace(name="tiny", slot_attn_bytes_per_token=2, declared_grid=Grid(
    shared_block_tokens=512, dual_block_tokens=16, dual_grid_tokens=1792, source="declared"))


def shared_layout(paging: str = "study", page: int = 100) -> OrgLayout:
    # a checkpoint of 2 SSM pages + 1 conv page: one request needs 1 + 3 = 4 pages
    return OrgLayout(org="s1", attn_block_tokens=16, grid_tokens=16, attn_page_bytes=page,
                     ckpt_page_bytes=page, ssm_pages=2, conv_pages=1, paging=paging,
                     attn_block_bytes=page, ssm_bytes=150, conv_bytes=40)


def dual_layout(paging: str = "study", attn: int = 16, ckpt: int = 100, **kw) -> OrgLayout:
    return OrgLayout(org="d0", attn_block_tokens=8, grid_tokens=8, attn_page_bytes=attn,
                     ckpt_page_bytes=ckpt, ssm_pages=1, dual_pool=True, paging=paging,
                     attn_block_bytes=attn, ssm_bytes=90, conv_bytes=10, **kw)


def split_of(split: PoolSplit, target: int, layout: OrgLayout, fraction: float = 0.5):
    pools = split.pools(target, "t", layout, GEOM, fraction)
    assert sum(p.target_bytes for p in pools) == target   # every byte goes to some pool
    return [(p.name, p.page_bytes, p.pages, p.rounding_loss_bytes) for p in pools]


def test_shared_pages_in_study_pages():
    # floor(1050 / 100) = 10 pages, 50 B left over
    assert split_of(SharedPages(), 1050, shared_layout()) == [("shared", 100, 10, 50)]


def test_shared_pages_refuses_less_than_one_request():
    assert split_of(SharedPages(), 400, shared_layout()) == [("shared", 100, 4, 0)]
    with pytest.raises(HbenchError, match="gives s1 3 pages; one request needs 4"):
        SharedPages().pools(399, "t", shared_layout(), GEOM, 0.5)


def test_shared_pages_in_vllm_blocks():
    # floor(1030 / 50) = 20 blocks, less the null block: 19 pages; the null
    # block's 50 B and the 30 B no block fits are the pool's loss
    assert split_of(SharedPages(), 1030, shared_layout("vllm", 50)) == [("shared", 50, 19, 80)]
    with pytest.raises(HbenchError, match="smaller than one vLLM block"):
        SharedPages().pools(49, "t", shared_layout("vllm", 50), GEOM, 0.5)


def test_dual_pools_in_study_pages():
    # attention: floor(0.3 x 1000) = 300 B -> floor(300 / 16) = 18 blocks = 288 B;
    # checkpoints: the other 712 B -> 7 units of 100 B, 12 B left over
    assert split_of(DualPools(), 1000, dual_layout(), 0.3) == [
        ("attention", 16, 18, 0), ("checkpoint", 100, 7, 12)]


def test_dual_pools_in_vllm_blocks():
    # floor(1000 / 50) = 20 blocks; 19 past the null block: attention
    # floor(0.5 x 19) = 9, checkpoints 10 (500 B); attention's target is the
    # other 500 B, its loss the null block's 50 B
    layout = dual_layout("vllm", attn=50, ckpt=50)
    assert split_of(DualPools(), 1000, layout, 0.5) == [
        ("attention", 50, 9, 50), ("checkpoint", 50, 10, 0)]
    assert vllm_d0_split(20, 0.5) == (9, 10)
    assert vllm_d0_split(4, 0.99) == (2, 1)      # each pool keeps at least one block
    with pytest.raises(HbenchError, match="at least 3 vLLM blocks"):
        vllm_d0_split(2, 0.5)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_dual_pools_refuse_a_fraction_outside_the_open_interval(fraction):
    for paging in ("study", "vllm"):
        with pytest.raises(HbenchError, match=r"--d0-attn-fraction must be in \(0, 1\)"):
            DualPools().pools(1000, "t", dual_layout(paging), GEOM, fraction)


def test_dual_pools_refuse_an_empty_pool_and_a_model_without_state():
    # floor(0.01 x 1000) = 10 B holds no 16 B block
    with pytest.raises(HbenchError, match="gives 0 attention blocks and 10 checkpoint units"):
        DualPools().pools(1000, "t", dual_layout(), GEOM, 0.01)
    with pytest.raises(HbenchError, match="d0 keeps a checkpoint pool, but tiny has no"):
        DualPools().pools(1000, "t", dual_layout(ckpt=0), GEOM, 0.5)


def test_one_region_in_study_pages_and_vllm_blocks():
    layout = dual_layout(one_region=True)
    # floor(1000 / 16) = 62 pages = 992 B, 8 B left over
    assert split_of(OneRegion(), 1000, layout) == [("region", 16, 62, 8)]
    with pytest.raises(HbenchError, match="one request needs 116 B"):
        OneRegion().pools(115, "t", layout, GEOM, 0.5)     # 7 pages = 112 B < 16 + 100
    vllm = dual_layout("vllm", attn=50, ckpt=50, one_region=True)
    assert split_of(OneRegion(), 1000, vllm) == [("region", 50, 19, 50)]
    with pytest.raises(HbenchError, match="at least 3 vLLM blocks"):
        OneRegion().pools(149, "t", vllm, GEOM, 0.5)


def test_label_pages():
    # an Np label counts the organization's own page under SharedPages, else
    # the model's shared attention page A (its declared 512 tokens x 2 B here)
    grid = grid_for(GEOM)
    assert SharedPages().label_page_bytes(shared_layout(), GEOM, grid) == 100
    assert DualPools().label_page_bytes(dual_layout(), GEOM, grid) == 1024
    assert OneRegion().label_page_bytes(dual_layout(), GEOM, grid) == 1024


def test_check_attn_fraction():
    assert check_attn_fraction(0.25) == 0.25
    with pytest.raises(HbenchError, match=r"^HBENCH_X must be in \(0, 1\), got 1.0$"):
        check_attn_fraction(1.0, "HBENCH_X")


def test_each_organization_names_its_split():
    kinds = {org: type(pool_split(org)).__name__ for org in ORGANIZATIONS}
    assert kinds == {"s0": "SharedPages", "s1": "SharedPages", "s2": "SharedPages",
                     "d0": "DualPools", "e0": "DualPools", "u0": "OneRegion"}
    geom = preset("falcon-h1-7b")
    for org in ORGANIZATIONS:   # the split's pool count is what the organization is built from
        split = pool_split(org)
        pages = (64,) * split.pool_count
        assert len(build_organization(layout_for(org, geom), pages).pools) >= split.pool_count


def test_config_plugin_plan_and_cli_refuse_a_fraction_with_the_one_check():
    from adapters.vllm_plugin.plan import ENV_D0_FRACTION, Plan, PlanError
    from harness.config import RunConfig
    from hbench.commands.ledger import parse_fraction

    want = r" must be in \(0, 1\), got 1.0$"
    with pytest.raises(HbenchError, match="^--d0-attn-fraction" + want):
        RunConfig(org="d0", d0_attn_fraction=1.0)
    with pytest.raises(HbenchError, match="^--d0-attn-fraction" + want):
        parse_fraction("1")
    with pytest.raises(PlanError, match=f"^{ENV_D0_FRACTION}" + want):
        Plan("d0", d0_attn_fraction=1.0)
