"""The grid rule (`harness.layout.rule_grid`), the engines' shapes, declared grids.

Golden values are derived by hand from each model's geometry (bytes per pool
layer: `ModelGeometry.slot_*`), in the comments beside them.
"""

from __future__ import annotations

import json

import pytest

from common.errors import HbenchError
from harness.config import RunConfig
from harness.layout import Grid, grid_for, rule_grid, sglang_grid, vllm_grid
from harness.model_configs import from_config, geometry_from_options, load_config, preset
from harness.orgs import layout_for
from harness.run_grid import run_grid
from tests.support import FIXTURES

FIX = FIXTURES / "configs"
FALCON = preset("falcon-h1-7b")
NEMOTRON = from_config(load_config(FIX / "nemotron_h.json"))
JAMBA = from_config(load_config(FIX / "jamba.json"))
LLAMA = from_config(load_config(FIX / "llama.json"))


def tokens(grid: Grid) -> tuple[int, int, int]:
    return grid.shared_block_tokens, grid.dual_block_tokens, grid.dual_grid_tokens


def test_the_rule_gives_falcon_h1_7b_the_studys_grid():
    # attention 2 x 2 KV heads x 128 x 2 B = 1,024 B a token; SSM 24 x 128 x 256 x 2 B
    # = 1,572,864 B, a third of it 524,288 B = 512 tokens exactly (1,024 would be 1 MiB);
    # checkpoint 1,594,368 B = 1,557 tokens, rounded up to 7 x 256 = 1,792
    g = FALCON
    assert (g.slot_attn_bytes_per_token, g.slot_ssm_bytes, g.slot_checkpoint_bytes) == (
        1024, 1_572_864, 1_594_368)
    assert tokens(rule_grid(g)) == (512, 16, 1792)
    assert rule_grid(g).source == "geometry rule"


def test_the_rule_on_a_nemotron_h_like_config():
    # 4 attention and 24 Mamba-2 layers: pool layer gcd(4, 24) = 4, so one attention
    # layer and 6 SSM layers per pool layer. Attention 2 x 8 x 128 x 2 B = 4,096 B a
    # token; SSM 6 x 128 heads x 64 x 128 x 2 B = 12,582,912 B, a third 4,194,304 B =
    # 1,024 tokens exactly; conv 6 x (8,192 + 2 x 8 x 128) x 3 x 2 B = 368,640 B, so a
    # checkpoint is 12,951,552 B = 3,162 tokens, rounded up to 13 x 256 = 3,328
    g = NEMOTRON
    assert (g.slot_attn_bytes_per_token, g.slot_ssm_bytes, g.slot_checkpoint_bytes) == (
        4096, 12_582_912, 12_951_552)
    assert tokens(rule_grid(g)) == (1024, 16, 3328)


def test_the_rule_on_a_jamba_like_config():
    # 4 attention (i % 8 == 4) and 28 Mamba-1 layers: pool layer 4, 7 SSM layers in it.
    # Attention 2 x 8 x (4,096 / 32) x 2 B = 4,096 B a token; SSM 7 x 8,192 x 16 x 2 B =
    # 1,835,008 B, a third 611,669 B = 149.3 tokens, so 128 (256 tokens is 1 MiB);
    # conv 7 x 8,192 x 3 x 2 B = 344,064 B, checkpoint 2,179,072 B = 532 tokens -> 768
    g = JAMBA
    assert (g.slot_attn_bytes_per_token, g.slot_ssm_bytes, g.slot_checkpoint_bytes) == (
        4096, 1_835_008, 2_179_072)
    assert tokens(rule_grid(g)) == (128, 16, 768)


def test_the_rule_without_recurrent_state_takes_its_smallest_values():
    # no SSM state: no page fits a third of one, so the smallest, 16; D0's one step, 256
    assert tokens(rule_grid(LLAMA)) == (16, 16, 256)


def test_a_page_of_exactly_a_third_of_the_state_fits_and_a_smaller_state_halves_it():
    from dataclasses import replace

    # Falcon's SSM state is exactly 3 x 512 KiB; one head dim less and 512 no longer fits
    smaller = replace(FALCON, ssm_head_dim=127)
    assert smaller.slot_ssm_bytes < 3 * 512 * 1024
    assert rule_grid(smaller).shared_block_tokens == 256


def test_engine_shapes():
    # vLLM: the smallest multiple of 16 tokens whose page holds a checkpoint:
    # Falcon 1,557 -> 1,568; Nemotron-H-like 3,162 -> 3,168; Jamba-like 532 -> 544
    assert tokens(vllm_grid(FALCON)) == (1568, 1568, 1568)
    assert tokens(vllm_grid(NEMOTRON)) == (3168, 3168, 3168)
    assert tokens(vllm_grid(JAMBA)) == (544, 544, 544)
    # SGLang: a state every 256 tokens (--mamba-track-interval), whatever the model
    assert tokens(sglang_grid(NEMOTRON)) == tokens(sglang_grid(FALCON)) == (256, 16, 256)


def test_the_studys_preset_declares_its_grid_and_others_get_the_rule():
    declared = grid_for(FALCON)
    assert tokens(declared) == (512, 16, 1792)
    assert declared.source == "declared by preset falcon-h1-7b"
    assert grid_for(FALCON, "rule") == rule_grid(FALCON)
    assert grid_for(NEMOTRON) == rule_grid(NEMOTRON)        # nothing declared
    # a Falcon size the study did not run follows the rule: 0.5B's SSM state
    # 24 x 64 x 128 x 2 B = 393,216 B, a third 131,072 B = 256 tokens of 512 B
    assert grid_for(preset("falcon-h1-0.5b")).shared_block_tokens == 256


def test_a_config_json_declares_its_grid(tmp_path):
    cfg = load_config(FIX / "nemotron_h.json") | {
        "hbench_grid": {"shared_block_tokens": 2048, "dual_block_tokens": 32,
                        "dual_grid_tokens": 4096}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    grid = grid_for(geometry_from_options(None, str(path)))
    assert tokens(grid) == (2048, 32, 4096)
    assert grid.source == f"declared in {path} (hbench_grid)"
    lay = layout_for("s1", geometry_from_options(None, str(path)))
    assert (lay.attn_block_tokens, lay.grid_tokens, lay.attn_page_bytes) == (2048, 2048, 2048 * 4096)


@pytest.mark.parametrize("record, words", [
    ([512, 16, 1792], "must be an object"),
    ({"shared_block_tokens": 512, "dual_block_tokens": 16}, "exactly the keys"),
    ({"shared_block_tokens": 512, "dual_block_tokens": 16, "dual_grid_tokens": 1792, "x": 1},
     "exactly the keys"),
    ({"shared_block_tokens": 0, "dual_block_tokens": 16, "dual_grid_tokens": 1792}, "in [1,"),
    ({"shared_block_tokens": "512", "dual_block_tokens": 16, "dual_grid_tokens": 1792}, "whole number"),
    ({"shared_block_tokens": 512, "dual_block_tokens": 16, "dual_grid_tokens": 1000}, "multiple"),
    ({"shared_block_tokens": 2**40, "dual_block_tokens": 16, "dual_grid_tokens": 1792}, "in [1,"),
])
def test_a_malformed_declared_grid_is_refused(record, words):
    cfg = load_config(FIX / "jamba.json") | {"hbench_grid": record}
    with pytest.raises(HbenchError, match="hbench_grid|grid") as err:
        from_config(cfg)
    assert words in str(err.value)


def test_a_run_config_picks_and_overrides_the_grid():
    assert tokens(run_grid(RunConfig(), FALCON)) == (512, 16, 1792)
    grid = run_grid(RunConfig(grid_from="vllm", shared_block_tokens=1024), FALCON)
    assert tokens(grid) == (1024, 1568, 1568)
    assert grid.origin == "vLLM's block rule, overridden by --shared-block-tokens"
    with pytest.raises(HbenchError, match="multiple of dual_block_tokens 16"):
        run_grid(RunConfig(dual_grid_tokens=1000), FALCON)


def test_layouts_follow_the_grid():
    s1, d0 = layout_for("s1", NEMOTRON), layout_for("d0", NEMOTRON)
    assert (s1.attn_block_tokens, s1.grid_tokens) == (1024, 1024)
    assert s1.ssm_pages == 3    # 12,582,912 B in pages of 1,024 x 4,096 B: exactly 3
    assert (d0.attn_block_tokens, d0.grid_tokens) == (16, 3328)
    u0 = layout_for("u0", JAMBA, grid=sglang_grid(JAMBA))
    assert (u0.attn_block_tokens, u0.grid_tokens) == (16, 256)
