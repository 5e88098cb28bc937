"""config.json -> FalconH1Config, and what the model refuses to load."""

from __future__ import annotations

import json
import math

import pytest

from adapters.tiny_model import PRESETS, write_weights
from common.errors import HbenchError

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from adapters.torch.config import FalconH1Config  # noqa: E402
from adapters.torch.model import FalconH1  # noqa: E402


def cfg_dict(**kw) -> dict:
    return PRESETS["tiny"].hf_config(64) | kw


def test_fields_and_derived_sizes_come_from_config_json():
    c = FalconH1Config.from_dict(cfg_dict(ssm_multipliers=[1, 2, 3, 4, 5], key_multiplier=0.5,
                                          time_step_limit=[0.001, 0.1]))
    assert (c.hidden_size, c.num_key_value_heads, c.head_dim, c.mamba_d_head) == (128, 2, 32, 32)
    assert c.conv_dim == 128 + 2 * 16 and c.conv_width == 3 and c.kv_groups == 2
    assert c.in_proj_split == (128, 128, 16, 16, 4)
    assert c.ssm_multipliers == (1.0, 2.0, 3.0, 4.0, 5.0) and c.key_multiplier == 0.5
    assert c.time_step_limit == (0.001, 0.1)


def test_defaults_follow_transformers_when_fields_are_absent():
    d = cfg_dict()
    for key in ("mamba_d_head", "head_dim", "time_step_limit", "ssm_multipliers",
                "mlp_multipliers", "rope_theta"):
        d.pop(key, None)
    c = FalconH1Config.from_dict(d)
    assert c.mamba_d_head == 128 // 4 and c.head_dim == 128 // 4
    assert c.time_step_limit == (0.0, math.inf) and c.ssm_multipliers == (1.0,) * 5
    assert c.rope_theta == 10000.0


@pytest.mark.parametrize("change, message", [
    (dict(model_type="bamba"), "model_type 'bamba' is not falcon_h1"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "rope type 'yarn'"),
    (dict(mamba_d_head=16), "mamba_n_heads x mamba_d_head = 4 x 16 != mamba_d_ssm 128"),
    (dict(num_key_value_heads=3), "not a multiple of num_key_value_heads 3"),
    (dict(ssm_multipliers=[1, 1]), "ssm_multipliers needs 5 values"),
    (dict(hidden_size="wide"), "malformed falcon_h1 config.json"),
])
def test_bad_configs_are_one_line_errors(change, message):
    with pytest.raises(HbenchError, match=message.replace("(", r"\(")):
        FalconH1Config.from_dict(cfg_dict(**change))


def test_missing_field_and_missing_files_are_named(tmp_path):
    d = cfg_dict()
    del d["mamba_d_state"]
    with pytest.raises(HbenchError, match="lacks required field 'mamba_d_state'"):
        FalconH1Config.from_dict(d)
    with pytest.raises(HbenchError, match="config file not found"):
        FalconH1.from_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg_dict()))
    with pytest.raises(HbenchError, match="weights file not found"):
        FalconH1.from_dir(tmp_path)


def test_a_checkpoint_missing_parameters_is_refused(tmp_path):
    spec = PRESETS["tiny"]
    write_weights(tmp_path, spec, 64, seed=0, config_overrides={"mamba_rms_norm": True})
    with pytest.raises(HbenchError, match=r"lacks 2 parameter\(s\), e.g. model.layers.0.mamba.norm"):
        FalconH1.from_dir(tmp_path)


def test_decode_refuses_a_block_table_that_does_not_cover_the_position(tmp_path):
    from adapters.torch.paging import kv_view, page_pool

    write_weights(tmp_path, PRESETS["tiny"], 64, seed=0)
    model = FalconH1.from_dir(tmp_path)
    s = model.shapes
    kv = kv_view(page_pool(4, s.n_layers, s.kv_block_elems(16)), s, 16)
    ssm, conv = s.zero_state(2)
    with pytest.raises(ValueError, match="does not cover"):
        model.decode(torch.tensor([1, 2]), torch.tensor([3, 16]), kv, [[0], [1]], ssm, conv)
    with pytest.raises(ValueError, match="blocks of 16 tokens"):
        model.prefill_chunk(torch.arange(20), 0, kv, [0], ssm[0], conv[0])
