"""Budgets: labels -> bytes -> each organization's page counts and rounding loss."""

from __future__ import annotations

import math

import pytest

from common.errors import HbenchError
from harness.budget import (
    parse_budget_bytes,
    resolve_all,
    resolve_budget,
    working_point_attn_share,
)
from harness.model_configs import from_config, load_config, preset
from harness.orgs import layout_for
from tests.support import FIXTURES

C = 1_594_368  # Falcon-H1-7B checkpoint bytes per layer (DESIGN.md section 1)
A = 512 * 1024  # 512-token attention page
A16 = 16 * 1024
GEOM = preset("falcon-h1-7b")
LLAMA = from_config(load_config(FIXTURES / "configs" / "llama.json"))


@pytest.mark.parametrize("n", [63, 83, 108])
def test_bn_gives_s0_n_pages_and_s1_s2_floor_n_times_1557_over_512(n):
    budgets = resolve_all(f"b{n}", GEOM)
    assert budgets["s0"].target_bytes == n * C
    assert budgets["s0"].pool("shared").pages == n
    assert budgets["s0"].rounding_loss_bytes == 0
    for org in ("s1", "s2"):
        shared = budgets[org].pool("shared")
        assert shared.pages == n * 1557 // 512
        assert shared.rounding_loss_bytes == n * C - shared.pages * A


def test_b83_pages_are_the_documented_252():
    b = resolve_budget("b83", layout_for("s1", GEOM), GEOM)
    assert b.total_pages == 252 and b.label == "b83"
    assert b.whole_model_bytes == 83 * C * 44


def test_d0_splits_bytes_by_fraction_attention_first():
    for f in (0.5, 0.3):
        b = resolve_budget("b83", layout_for("d0", GEOM), GEOM, d0_attn_fraction=f)
        blocks = math.floor(f * 83 * C) // A16
        attn, ckpt = b.pools
        assert (attn.name, ckpt.name) == ("attention", "checkpoint")
        # attention takes whole blocks of its share; the checkpoint pool every other byte
        assert attn.pages == blocks and ckpt.pages == (83 * C - blocks * A16) // C
        assert attn.rounding_loss_bytes == 0 and ckpt.rounding_loss_bytes < C
        assert attn.target_bytes + ckpt.target_bytes == 83 * C
        assert b.d0_attn_fraction == f
        assert b.rounding_loss_bytes == 83 * C - attn.pages * A16 - ckpt.pages * C


def test_np_counts_each_organizations_own_page():
    assert resolve_budget("252p", layout_for("s0", GEOM), GEOM).target_bytes == 252 * C
    assert resolve_budget("252p", layout_for("s1", GEOM), GEOM).pool("shared").pages == 252
    d0 = resolve_budget("252p", layout_for("d0", GEOM), GEOM)
    assert d0.target_bytes == 252 * A  # the bytes S1/S2 get
    with pytest.raises(HbenchError, match="give an organization"):
        parse_budget_bytes("252p", GEOM)


@pytest.mark.parametrize("text, whole, label", [
    ("12GiB", 12 * 2**30, "12GiB"),
    ("12gib", 12 * 2**30, "12GiB"),
    ("512MiB", 512 * 2**20, "512MiB"),
    ("1.5GB", 1_500_000_000, "1.5GB"),
    ("123456789B", 123_456_789, "123456789B"),
])
def test_whole_model_sizes_divide_over_pool_layers(text, whole, label):
    assert parse_budget_bytes(text, GEOM) == (whole // 44, label)


@pytest.mark.parametrize("text", ["b0", "b-3", "x83", "", "83", "0GiB", "12 parsecs", "1.5.2GB",
                                  "2000TiB", "b99999999999", "-5GiB"])
def test_bad_budget_texts_list_the_accepted_forms(text):
    with pytest.raises(HbenchError) as exc:
        resolve_budget(text, layout_for("s2", GEOM), GEOM)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "bN" in msg or "zero bytes" in msg


def test_budgets_that_cannot_hold_one_request_are_errors():
    with pytest.raises(HbenchError, match="gives s0 1 pages"):
        resolve_budget("b1", layout_for("s0", GEOM), GEOM)
    with pytest.raises(HbenchError, match="0 checkpoint units"):
        resolve_budget("b1", layout_for("d0", GEOM), GEOM)
    with pytest.raises(HbenchError, match="0 attention blocks"):
        resolve_budget("1000B", layout_for("d0", GEOM), GEOM)
    with pytest.raises(HbenchError, match=r"must be in \(0, 1\)"):
        resolve_budget("b83", layout_for("d0", GEOM), GEOM, d0_attn_fraction=1.0)
    with pytest.raises(HbenchError, match="unknown organization"):
        parse_budget_bytes("b83", GEOM, "s9")


def test_pure_attention_model_has_no_bn_and_no_d0():
    with pytest.raises(HbenchError, match="no recurrent state"):
        resolve_budget("b83", layout_for("s1", LLAMA), LLAMA)
    budgets = resolve_all("12GiB", LLAMA)
    assert sorted(budgets) == ["s0", "s1", "s2"]
    # no SSM state: the geometry rule's smallest page, 16 tokens of 4,096 B
    assert budgets["s1"].pool("shared").pages == (12 * 2**30 // 32) // (16 * 4096)


def test_pool_lookup_names_the_missing_pool():
    with pytest.raises(KeyError, match="no pool 'attention'"):
        resolve_budget("b83", layout_for("s2", GEOM), GEOM).pool("attention")


def test_default_d0_fraction_reasoning_share_is_0_518():
    # 209 blocks x 16 KiB of attention vs 2 checkpoints x 1557 KiB (module docstring)
    expected = (209 * 16) / (209 * 16 + 2 * 1557)
    assert working_point_attn_share(GEOM) == pytest.approx(expected)
    assert round(expected, 3) == 0.518
