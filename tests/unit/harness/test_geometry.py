"""Geometry: golden per-layer sizes, presets, builders for each hybrid family, errors."""

from __future__ import annotations

import json

import pytest

from common.errors import HbenchError
from harness.model_configs import BUILDERS, PRESETS, from_config, load_config, preset
from tests.support import FIXTURES

FIX = FIXTURES / "configs"


def fixture(name: str, **dtypes):
    return from_config(load_config(FIX / f"{name}.json"), **dtypes)


def test_falcon_h1_7b_golden_per_layer_sizes_match_design_section_1():
    g = preset("falcon-h1-7b")
    assert g.attn_bytes_per_token == 2 * 2 * 128 * 2 == 1024
    assert g.ssm_state_bytes == 24 * 128 * 256 * 2 == 1_572_864
    assert g.conv_state_bytes == (3072 + 2 * 1 * 256) * (4 - 1) * 2 == 21_504
    assert g.checkpoint_bytes == 1_594_368
    assert g.checkpoint_bytes // 1024 == 1557


def test_fp32_ssm_state_doubles_the_ssm_state_only():
    bf, fp = preset("falcon-h1-7b"), preset("falcon-h1-7b", ssm_state_dtype="fp32")
    assert fp.ssm_state_bytes == 2 * bf.ssm_state_bytes == 3_145_728
    assert fp.conv_state_bytes == bf.conv_state_bytes
    assert fp.attn_bytes_per_token == bf.attn_bytes_per_token
    assert fp.weights_bytes == bf.weights_bytes


def test_whole_model_totals_multiply_by_layers_of_each_kind():
    g = preset("falcon-h1-7b")
    assert g.model_attn_bytes_per_token == 44 * 1024
    assert g.model_checkpoint_bytes == 44 * 1_594_368
    assert g.layer_counts == {"layers": 44, "attention": 44, "ssm": 44, "mlp": 44, "moe": 0,
                              "pool_layers": 44}


def test_falcon_h1_7b_param_count_is_in_its_published_size_class():
    g = preset("falcon-h1-7b")
    assert abs(g.param_count - 7.6e9) / 7.6e9 < 0.02
    assert g.weights_bytes == 2 * g.param_count
    assert sum(g.param_breakdown().values()) == g.param_count


# (depth, dim, attn heads, kv, mamba heads, d_head attn, d_head mamba, d_state, params low, high)
FALCON_TABLE = {
    "falcon-h1-0.5b": (36, 1024, 8, 2, 24, 64, 64, 128, 0.45e9, 0.60e9),
    "falcon-h1-1.5b": (24, 2048, 8, 2, 48, 128, 64, 256, 1.35e9, 1.70e9),
    "falcon-h1-3b": (32, 2560, 10, 2, 32, 128, 128, 256, 2.9e9, 3.4e9),
    "falcon-h1-7b": (44, 3072, 12, 2, 24, 128, 128, 256, 7.3e9, 7.9e9),
    "falcon-h1-34b": (72, 5120, 20, 4, 32, 128, 128, 256, 32e9, 35e9),
}


@pytest.mark.parametrize("name", sorted(FALCON_TABLE))
def test_falcon_h1_presets_follow_the_published_table(name):
    depth, dim, heads, kv, mheads, hd, mhd, dstate, lo, hi = FALCON_TABLE[name]
    g = preset(name)
    assert (g.n_layers, g.hidden_size, g.num_attention_heads, g.num_kv_heads) == (depth, dim, heads, kv)
    assert (g.ssm_n_heads, g.head_dim, g.ssm_head_dim, g.ssm_d_state) == (mheads, hd, mhd, dstate)
    assert g.ssm_d_inner == mheads * mhd
    assert lo < g.param_count < hi


def test_presets_cover_every_falcon_h1_size():
    assert {"falcon-h1-0.5b", "falcon-h1-1.5b", "falcon-h1-3b", "falcon-h1-7b",
            "falcon-h1-34b"} <= set(PRESETS)
    assert preset("Falcon-H1-7B") == preset("falcon-h1-7b")


def test_bamba_counts_attention_at_listed_indices_and_sizes_mamba2_state():
    g = fixture("bamba")
    assert (g.n_layers, g.n_attn_layers, g.n_ssm_layers) == (32, 3, 29)
    assert g.ssm_state_bytes == 128 * 64 * 128 * 2
    assert g.conv_state_bytes == (128 * 64 + 2 * 1 * 128) * 3 * 2
    assert g.attn_bytes_per_token == 2 * 8 * 128 * 2
    assert abs(g.param_count - 9.78e9) / 9.78e9 < 0.03  # Bamba-9B


def test_nemotron_h_reads_the_override_pattern():
    g = fixture("nemotron_h")
    assert g.layer_counts == {"layers": 52, "attention": 4, "ssm": 24, "mlp": 24, "moe": 0,
                              "pool_layers": 4}
    assert g.conv_state_bytes == (128 * 64 + 2 * 8 * 128) * 3 * 2
    assert g.slot_checkpoint_bytes == 6 * g.checkpoint_bytes  # 24 SSM layers over 4 pool layers
    assert abs(g.param_count - 8.1e9) / 8.1e9 < 0.03  # Nemotron-H-8B


def test_granitemoehybrid_reads_layer_types_and_experts():
    g = fixture("granitemoehybrid")
    assert (g.n_attn_layers, g.n_ssm_layers, g.n_moe_layers, g.mlp_layers) == (4, 36, 40, 0)
    assert g.ssm_state_bytes == 128 * 64 * 128 * 2
    assert g.tie_word_embeddings and g.param_breakdown()["lm_head"] == 0
    assert abs(g.param_count - 32e9) / 32e9 < 0.03  # Granite-4.0-H-Small


def test_jamba_is_mamba1_with_periodic_attention_and_experts():
    g = fixture("jamba")
    assert (g.n_attn_layers, g.n_ssm_layers, g.n_moe_layers, g.mlp_layers) == (4, 28, 16, 16)
    assert g.ssm_kind == "mamba1" and g.ssm_d_inner == 2 * 4096
    assert g.ssm_state_bytes == 8192 * 16 * 2
    assert g.conv_state_bytes == 8192 * 3 * 2
    assert g.pool_layers == 4 and g.slot_checkpoint_bytes == 7 * g.checkpoint_bytes
    assert abs(g.param_count - 51.6e9) / 51.6e9 < 0.03  # Jamba-v0.1


def test_pure_attention_model_builds_without_recurrent_state():
    g = fixture("llama")
    assert (g.n_attn_layers, g.n_ssm_layers, g.checkpoint_bytes) == (32, 0, 0)
    assert g.model_attn_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert abs(g.param_count - 8.03e9) / 8.03e9 < 0.02  # Llama-3.1-8B
    for mt in ("mistral", "qwen2", "qwen3"):
        assert mt in BUILDERS


def test_auto_head_dim_resolves_from_expand_and_heads():
    cfg = dict(PRESETS["falcon-h1-7b"], mamba_d_head="auto")
    cfg.pop("mamba_d_ssm")
    g = from_config(cfg)
    assert g.ssm_head_dim == 2 * 3072 // 24 == 256


@pytest.mark.parametrize("name, words", [
    ("unsupported", "unsupported model_type 'gpt_bigcode'"),
    ("missing_field", "lacks required field 'attn_layer_indices'"),
    ("bad_field", "'num_hidden_layers' must be an integer"),
    ("not_json", "is not valid JSON"),
    ("absent", "config file not found"),
])
def test_bad_configs_raise_one_line_errors(name, words):
    with pytest.raises(HbenchError) as exc:
        fixture(name)
    assert words in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("patch, words", [
    ({"hybrid_override_pattern": "M*X"}, "string of M, *, - and E"),
    ({"hybrid_override_pattern": "MMMM"}, "no attention layers"),
    ({"mamba_num_heads": 0}, "'mamba_num_heads' must be an integer >= 1"),
])
def test_malformed_nemotron_fields_are_rejected(patch, words):
    cfg = dict(load_config(FIX / "nemotron_h.json"), **patch)
    with pytest.raises(HbenchError, match=words.replace("*", r"\*")):
        from_config(cfg)


def test_jamba_offset_must_be_inside_period():
    cfg = dict(load_config(FIX / "jamba.json"), attn_layer_offset=8)
    with pytest.raises(HbenchError, match="attn_layer_offset 8 must be < attn_layer_period 8"):
        from_config(cfg)


def test_json_that_is_not_an_object_is_rejected(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps([1, 2]))
    with pytest.raises(HbenchError, match="holds a JSON list, not an object"):
        load_config(tmp_path)  # a folder resolves to its config.json


def test_unknown_preset_and_dtype_are_errors():
    with pytest.raises(HbenchError, match="unknown model 'gpt-5'"):
        preset("gpt-5")
    with pytest.raises(HbenchError, match="unknown dtype"):
        preset("falcon-h1-7b", ssm_state_dtype="fp8")
