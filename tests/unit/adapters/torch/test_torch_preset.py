"""The proportional tiny model: Falcon-H1-7B's state proportions, served by adapters.torch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from adapters.tiny_model import PRESETS, write_weights
from harness.model_configs import from_config, preset
from harness.orgs import layout_for
from hbench.cli import cli

BLOCK = 512


def test_proportional_preset_has_the_7b_state_proportions():
    tiny = from_config(PRESETS["proportional"].hf_config(2048))
    big = preset("falcon-h1-7b")
    for g in (tiny, big):
        block = BLOCK * g.attn_bytes_per_token
        assert g.ssm_state_bytes == 3 * block                   # SSM state: 3 blocks exactly
        assert 3.0 < g.checkpoint_bytes / block < 3.1           # checkpoint: about 3 blocks
        assert g.conv_state_bytes < block / 16                  # conv: fits a 1/16-page slot
    assert tiny.attn_bytes_per_token * BLOCK == 128 * 1024      # bf16 per layer
    assert tiny.ssm_state_bytes == 384 * 1024 and tiny.conv_state_bytes == 7680
    for org in ("s0", "s1", "s2", "d0"):                        # the same organization layouts
        a, b = layout_for(org, tiny), layout_for(org, big)
        assert (a.ckpt_pages, a.conv_pages, a.conv_slots, a.slab_slots) == \
               (b.ckpt_pages, b.conv_pages, b.conv_slots, b.slab_slots), org
    old = from_config(PRESETS["tiny"].hf_config(2048))
    assert old.checkpoint_bytes < BLOCK * old.attn_bytes_per_token / 10  # the other way round


def test_geometry_command_shows_the_ratios_of_a_written_model(tmp_path):
    write_weights(tmp_path, PRESETS["proportional"], 2048, seed=0)
    res = CliRunner().invoke(cli, ["geometry", "--config", str(tmp_path / "config.json"),
                                   "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["per_layer"]["ssm_state_bytes"] == 3 * BLOCK * rep["per_layer"][
        "attention_bytes_per_token"]
    assert rep["layouts"]["s1"]["members"] == "3 SSM + 1 conv pages"
    assert rep["layouts"]["s2"]["members"] == "3 SSM + 8 KiB conv slot (16/slab)"


def test_unknown_preset_is_one_error_line(tmp_path):
    res = CliRunner().invoke(cli, ["tiny-model", "--preset", "huge", "-o", str(tmp_path)])
    assert res.exit_code != 0 and "'huge' is not one of 'tiny', 'proportional'" in res.output


@pytest.mark.slow
def test_proportional_model_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from adapters.torch.model import FalconH1
    from adapters.torch.paging import kv_view, page_pool

    write_weights(tmp_path, PRESETS["proportional"], 2048, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokens = torch.tensor(np.random.default_rng(0).integers(0, 2048, 80))
        ref_model = transformers.FalconH1ForCausalLM.from_pretrained(
            str(tmp_path), dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            ref = ref_model(tokens[None]).logits[0]
        model = FalconH1.from_dir(tmp_path)
        s = model.shapes
        kv = kv_view(page_pool(1, s.n_layers, s.kv_block_elems(BLOCK)), s, BLOCK)
        ssm, conv = s.zero_state()
        got = [model.prefill_chunk(tokens[:70], 0, kv, [0], ssm, conv)]
        S, C = ssm[None].clone(), conv[None].clone()
        for t in range(70, 80):
            got.append(model.decode(tokens[t:t + 1], torch.tensor([t]), kv, [[0]], S, C))
        err = float((torch.cat(got) - ref).abs().max())
        assert err <= 1e-4 * float(ref.abs().max())
    finally:
        torch.set_num_threads(threads)
