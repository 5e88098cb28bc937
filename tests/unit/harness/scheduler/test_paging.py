"""``--paging vllm``: the organizations laid out in vLLM's blocks.

The golden numbers are derived by hand from DESIGN.md's Falcon-H1-7B sizes
(A = 1 KiB per token per layer, C = 1557 KiB = 1,594,368 B) and vLLM 0.32's
rule for a hybrid block (the smallest multiple of 128 tokens whose attention
page holds one Mamba state): ceil(1,594,368 / (128 x 1,024)) = 13, so a block
is 1,664 tokens and a page 1,664 KiB.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from adapters.vllm import VllmEngine
from adapters.vllm_plugin.plan import PageLayout, d0_split
from common.errors import HbenchError
from harness.budget import resolve_budget, vllm_blocks, vllm_d0_split
from harness.config import RunConfig
from harness.layout import grid_for, vllm_block_tokens
from harness.model_configs import PRESETS, preset
from harness.orgs import layout_for
from harness.results import read_run
from hbench.cli import cli
from tests.support.sim_pair import assert_identical, random_config, run_both

GEOM = preset("falcon-h1-7b")
KIB = 1024
BLOCK = 1664
PAGE = BLOCK * KIB


def test_falcon_h1_7b_block_is_1664_tokens():
    assert vllm_block_tokens(KIB, 1_594_368) == BLOCK
    assert vllm_block_tokens(KIB, 128 * KIB) == 128        # exactly one 128-token page
    assert vllm_block_tokens(KIB, 128 * KIB + 1) == 256


@pytest.mark.parametrize("org, ssm_pages, conv_pages, slots", [
    ("s0", 1, 0, 0), ("s1", 3, 1, 0), ("s2", 3, 0, 16), ("d0", 1, 0, 0)])
def test_vllm_layout_keeps_the_study_page_counts_in_vllm_blocks(org, ssm_pages, conv_pages, slots):
    lay = layout_for(org, GEOM, "vllm")
    assert (lay.attn_block_tokens, lay.grid_tokens) == (BLOCK, BLOCK)
    assert lay.attn_page_bytes == lay.ckpt_page_bytes == PAGE
    assert (lay.ssm_pages, lay.conv_pages, lay.slab_slots) == (ssm_pages, conv_pages, slots)
    assert lay.slot_bytes == (PAGE // 16 if slots else 0)
    assert lay.dual_pool == (org == "d0")
    # what the bytes are for does not change
    assert (lay.ssm_bytes, lay.conv_bytes) == (layout_for(org, GEOM).ssm_bytes,
                                               layout_for(org, GEOM).conv_bytes)


def test_unknown_paging_is_refused():
    with pytest.raises(ValueError, match="unknown paging"):
        layout_for("s1", GEOM, "sglang")
    with pytest.raises(HbenchError, match="unknown --paging"):
        RunConfig(paging="pages")


def test_vllm_blocks_are_the_labels_bytes_in_vllm_pages_for_every_org():
    # floor(83 x 1,594,368 / (1,664 x 1,024)) = 77 blocks, whatever the organization
    assert [vllm_blocks("b83", org, GEOM) for org in ("s0", "s1", "s2", "d0")] == [77] * 4


def test_vllm_budget_keeps_block_zero_out_and_splits_d0_by_blocks():
    s0 = resolve_budget("b83", layout_for("s0", GEOM, "vllm"), GEOM)
    assert s0.pool("shared").pages == 76 and s0.pool("shared").page_bytes == PAGE
    assert s0.target_bytes == 83 * 1_594_368 and s0.allocated_bytes == 77 * PAGE
    assert s0.rounding_loss_bytes == 83 * 1_594_368 - 76 * PAGE   # the null block and the tail
    s1 = resolve_budget("b83", layout_for("s1", GEOM, "vllm"), GEOM)
    assert s1.total_pages == 76 and s1.allocated_bytes == s0.allocated_bytes
    d0 = resolve_budget("b83", layout_for("d0", GEOM, "vllm"), GEOM, 0.25)
    attn, ckpt = d0.pools
    assert (attn.pages, ckpt.pages) == (19, 57)            # floor(0.25 x 76), the rest
    assert attn.page_bytes == ckpt.page_bytes == PAGE
    assert d0.allocated_bytes == 77 * PAGE and d0.target_bytes == s0.target_bytes


def test_d0_split_refuses_a_budget_without_room_for_both_pools():
    assert vllm_d0_split(4, 0.99) == (2, 1)
    with pytest.raises(HbenchError, match="at least 3 vLLM blocks"):
        resolve_budget("b2", layout_for("d0", GEOM, "vllm"), GEOM)


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("org", ["s1", "s2", "d0"])
def test_plugin_and_simulator_charge_the_same_pages(name, org):
    """The plugin counts from vLLM's state bytes (float32 on CPU: every size
    doubled) at the model's page grid (`VllmEngine.plugin_grid_tokens`); the
    simulator from hbench's geometry. Same counts either way."""
    geom = preset(name)
    lay = layout_for(org, geom, "vllm")
    grid = VllmEngine.plugin_grid_tokens(RunConfig(model=name))
    assert grid == grid_for(geom).shared_block_tokens
    for scale in (1, 2):
        plugin = PageLayout(org, scale * geom.slot_ssm_bytes, scale * geom.slot_conv_bytes,
                            scale * geom.slot_attn_bytes_per_token, grid)
        want = 1 if org == "d0" else lay.ckpt_pages
        assert plugin.pages_per_checkpoint == want
        assert plugin.slab_slots == lay.slab_slots
    assert d0_split(101, 0.3) == vllm_d0_split(101, 0.3)


def test_engines_refuse_a_paging_they_cannot_lay_out():
    from adapters.registry import check_paging, make_engine

    check_paging(make_engine("sim"), "vllm")
    with pytest.raises(HbenchError, match="--paging vllm is not expressible on torch"):
        check_paging(make_engine("torch"), "vllm")
    with pytest.raises(HbenchError, match="--paging study is not expressible on a vLLM server"):
        make_engine("vllm", python="/nonexistent").check_config(
            RunConfig(engine="vllm", org="s2", launch=True, paging="study"))
    assert RunConfig(engine="sim").resolved_paging == "study"


@pytest.mark.parametrize(("org", "server", "paging"), [
    ("s0", False, "vllm-gpu"), ("d0", False, "vllm-gpu"), ("s1", False, "study"),
    ("s2", False, "study"), ("s2", True, "vllm"), ("s1", True, "vllm")])
def test_vllm_lays_out_its_own_blocks_except_s1_s2_in_process(org, server, paging):
    """In process no state tensor exists, so S1/S2 take the study's pages
    (harness.layout.VLLM_STUDY_PAGE_ORGS); a server reads whole states per block."""
    config = RunConfig(engine="vllm", org=org, launch=server)
    assert config.resolved_paging == paging


@pytest.mark.parametrize("org", ["s0", "s1", "s2", "d0"])
def test_stretches_are_identical_under_vllm_paging(org):
    config = RunConfig(org=org, budget="b12", paging="vllm", requests=14, rate=20.0,
                       mean_input=3000, max_output=400, contexts=2, max_model_len=4096,
                       cap=16, token_budget=BLOCK, seed=3)
    slow, fast = run_both(config)
    assert_identical(slow, fast)
    assert slow.engine_info["attn_block_tokens"] == BLOCK


def test_run_cli_records_the_paging_and_the_blocks(tmp_path):
    res = CliRunner().invoke(cli, ["run", "--org", "s1", "--budget", "b24", "--paging", "vllm",
                                   "--requests", "8", "--rate", "4", "--mean-input", "2600",
                                   "--max-output", "64", "--max-model-len", "4096",
                                   "--token-budget", "1664", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    manifest = read_run(run_dir).manifest
    assert manifest["config"]["paging"] == "vllm" and manifest["budget"]["paging"] == "vllm"
    pools = manifest["budget"]["pools"]
    # b24: floor(24 x 1,594,368 / 1,703,936) = 22 blocks, less the null block
    assert [(p["pages"], p["page_bytes"]) for p in pools] == [(21, PAGE)]
    assert manifest["budget"]["allocated_bytes_per_pool_layer"] == 22 * PAGE
    assert manifest["engine_info"]["attn_block_tokens"] == BLOCK


def test_run_cli_refuses_a_token_budget_below_the_vllm_block(tmp_path):
    res = CliRunner().invoke(cli, ["run", "--org", "s0", "--budget", "b8", "--paging", "vllm",
                                   "--token-budget", "512", "--out", str(tmp_path)])
    assert res.exit_code != 0
    assert "grid of 1664 tokens" in res.output
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("case", range(16))
def test_stretches_are_identical_on_random_configs_under_vllm_paging(case):
    """As tests/unit/harness/scheduler/test_scheduler_stretch.py, in vLLM's blocks: edges published in place
    (decode edges too) and released when the step that continued past them ends."""
    import dataclasses

    import numpy as np

    rng = np.random.default_rng(7_000 + case)
    config = dataclasses.replace(random_config(rng), paging="vllm",
                                 budget=str(rng.choice(["b8", "b12", "b24"])),
                                 max_model_len=4096, contexts=2)
    try:
        slow, fast = run_both(config)
    except HbenchError as exc:        # a request larger than the pool: refused alike
        pytest.skip(str(exc))
    assert_identical(slow, fast)


def test_a_cuda_vllms_block_is_1568_tokens():
    """FlashAttention's kernel block is 16 tokens, so a CUDA vLLM raises the
    hybrid block in steps of 16: ceil(1,594,368 / (16 x 1,024)) = 98, 1,568
    tokens (the CPU build's 128-token steps give 1,664)."""
    lay = layout_for("s0", GEOM, "vllm-gpu")
    assert (lay.attn_block_tokens, lay.attn_page_bytes, lay.paging) == (1568, 1568 * KIB,
                                                                         "vllm-gpu")
    # b83: floor(83 x 1,594,368 / 1,605,632) = 82 blocks, the null block among them
    budget = resolve_budget("b83", lay, GEOM)
    assert budget.pools[0].pages + 1 == 82 and budget.allocated_bytes == 82 * 1568 * KIB


@pytest.mark.parametrize("paging", ["vllm", "vllm-gpu"])
def test_a_prefill_chunk_stops_at_the_edge_vllm_caches(paging, tmp_path):
    """vLLM's align mode caches a state only where a chunk ends, and ends a
    prefill chunk at the last edge before the prompt's end
    (``_mamba_block_aligned_split``): a prompt served in one 8,192-token step
    is split there, so the next request of its shared context adopts that
    edge. Requests 4 s apart: nothing else runs, nothing is evicted."""
    res = CliRunner().invoke(cli, ["run", "--org", "s0", "--budget", "b83", "--paging", paging,
                                   "--requests", "12", "--rate", "0.25", "--arrival", "constant",
                                   "--contexts", "2", "--out", str(tmp_path), "--seed", "1"])
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    import pandas as pd

    block = layout_for("s0", GEOM, paging).attn_block_tokens
    reqs = pd.read_parquet(run_dir / "requests.parquet").sort_values("arrival_s")
    first_of_group = ~reqs["prefix_group"].duplicated()
    # the first of each context reuses nothing; a later one adopts an edge an
    # earlier prompt of its context cached (a whole number of blocks), or, where
    # those edges all lie past the shared context, finds its cached attention
    # deeper than any state: the junction, whose state it caches for the next
    assert (reqs.loc[first_of_group, "reused_tokens"] == 0).all()
    later = reqs.loc[~first_of_group]
    hit = later["reused_tokens"] > 0
    assert ((later["reused_tokens"] % block == 0) & (later["reused_tokens"] < later["prompt_tokens"])).all()
    assert (hit | (later["attn_depth"] > later["j_adopt"])).all()
    assert hit.sum() >= len(later) - reqs["prefix_group"].nunique() > 0
