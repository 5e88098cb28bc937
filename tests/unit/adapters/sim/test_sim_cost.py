"""Roofline cost model and hardware presets (adapters/sim/cost.py, hardware.py).

Expected values are re-derived here by hand from Falcon-H1-7B's config
numbers (hidden 3072, MLP 12288, 44 layers, 12 q / 2 kv heads of 128, Mamba-2
24 heads x 128 x d_state 256, 1 group, d_conv 4, vocab 130049, untied) and
the datasheet peaks, never by calling the code under test.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from adapters.sim.cost import (
    DEFAULTS,
    CostConstants,
    CostModel,
    param_counts,
)
from adapters.sim.hardware import HARDWARE, Hardware, get_hardware
from common.errors import HbenchError
from harness.engine.shape import StepShape
from harness.model_configs import preset
from hbench.cli import cli

A100_RATE = 1555e9 * 0.8  # bytes/s at the default mem_efficiency
GEMM_RATE = 312e12 * 0.6  # FLOP/s at the default compute_efficiency
OVERHEAD = 0.004

# Falcon-H1-7B parameters, by hand
EMB = 130049 * 3072  # 399,510,528 (input embedding; lm_head the same, untied)
ATTN = 3072 * (12 * 128 + 2 * 2 * 128) + 12 * 128 * 3072  # q, k, v, o
MAMBA = (
    3072 * (2 * 3072 + 2 * 256 + 24)  # in_proj
    + (3072 + 2 * 256) * (4 + 1)  # conv weight + bias
    + 3 * 24  # A_log, D, dt_bias
    + 3072 * 3072  # out_proj
)  # Falcon-H1's config sets no gated RMSNorm (mamba_rms_norm false)
MLP = 3 * 3072 * 12288
BODY = 44 * (ATTN + MAMBA + MLP + 2 * 3072) + 3072  # 6,786,498,656
KV_PER_TOKEN = 2 * 2 * 128 * 2 * 44  # K+V, 2 kv heads, 128 dims, bf16, 44 layers
CKPT = 24 * 128 * 256 * 2 + (3072 + 2 * 256) * 3 * 2  # 1,594,368 B per layer
STATE_RW = 2 * CKPT * 44  # read + write in every layer
ATTN_PER_PAIR = 4 * 12 * 128 * 44
# SSD per token per layer: 2(GQN + HQP + 2HNP) + conv 2 x 3584 x 4
SCAN_PREFILL = 2 * (256 * 256 + 24 * 256 * 128 + 2 * 24 * 256 * 128) + 2 * 3584 * 4


@pytest.fixture(scope="module")
def geom():
    return preset("falcon-h1-7b")


@pytest.fixture(scope="module")
def a100(geom):
    return CostModel(geom, get_hardware("a100-pcie-40gb"))


def decode(n=1, ctx=100):
    return StepShape(
        prefill_tokens=0,
        prefill_attn_pairs=0,
        decode_requests=n,
        decode_context_tokens=n * ctx,
        prefill_context_tokens=0,
        state_requests=n,
        checkpoint_copies=0,
    )


def prefill(new=4096, ctx=0):
    return StepShape(
        prefill_tokens=new,
        prefill_attn_pairs=new * (ctx + (new + 1) / 2),
        decode_requests=0,
        decode_context_tokens=0,
        prefill_context_tokens=ctx,
        state_requests=1,
        checkpoint_copies=0,
    )


# ---- hardware presets --------------------------------------------------------
def test_presets_hold_datasheet_peaks():
    a, h1, h2 = HARDWARE["a100-pcie-40gb"], HARDWARE["h100-sxm"], HARDWARE["h200"]
    assert (a.mem_bw_bytes_s, a.dense_flops_s, a.mem_bytes) == (1555e9, 312e12, 40 * 2**30)
    assert (h1.mem_bw_bytes_s, h1.dense_flops_s, h1.mem_bytes) == (3.35e12, 989e12, 80 * 2**30)
    assert (h2.mem_bw_bytes_s, h2.dense_flops_s, h2.mem_bytes) == (4.8e12, 989e12, 141 * 2**30)
    assert all("datasheet" in h.provenance for h in HARDWARE.values())


def test_get_hardware_is_case_insensitive():
    assert get_hardware("H200") is HARDWARE["h200"]


def test_unknown_hardware_lists_choices():
    with pytest.raises(HbenchError, match="unknown hardware 'v100'") as exc:
        get_hardware("v100")
    for name in ("a100-pcie-40gb", "h100-sxm", "h200"):
        assert name in str(exc.value)


# ---- parameter counts (read from the geometry) ---------------------------------
def test_parameter_counts_for_falcon_h1_7b(geom):
    assert geom.ssm_norm is False  # the hand count above assumes it
    p = param_counts(geom)
    assert (p.embedding, p.lm_head) == (EMB, EMB)
    assert p.body == p.body_active == BODY == 6_786_498_656
    assert p.total == 7_585_519_712


# ---- sanity anchors -------------------------------------------------------------
def test_single_decode_is_memory_bound_and_weight_streaming(a100):
    c = a100.step(decode(1, ctx=100))
    assert c.bound == "memory"
    streamed = (BODY + EMB) * 2  # weights + lm_head, not the gathered input table
    assert c.weights_s == pytest.approx(streamed / A100_RATE, rel=1e-12)
    assert c.kv_s == pytest.approx((100 + 1) * KV_PER_TOKEN / A100_RATE, rel=1e-12)
    assert c.state_io_s == pytest.approx(STATE_RW / A100_RATE, rel=1e-12)
    # the anchor: ~ all weight bytes / (1555 GB/s x 0.8) + 4 ms; within 5% because the
    # untied input embedding (5% of the bytes) is gathered, not streamed
    assert c.total_s == pytest.approx((BODY + 2 * EMB) * 2 / A100_RATE + OVERHEAD, rel=0.05)


def test_4096_token_prefill_is_compute_bound(a100):
    c = a100.step(prefill(4096))
    assert c.bound == "compute"
    pairs = 4096 * 4097 / 2
    gemm = 2 * BODY * 4096 + ATTN_PER_PAIR * pairs
    scan = SCAN_PREFILL * 44 * 4096
    assert c.flops == pytest.approx(gemm + scan, rel=1e-12)
    assert c.compute_s == pytest.approx(gemm / GEMM_RATE + scan / (GEMM_RATE * 0.5), rel=1e-12)
    assert c.total_s == pytest.approx(c.compute_s + OVERHEAD, rel=1e-12)
    assert c.compute_s > 10 * c.memory_s


def test_doubling_bandwidth_halves_memory_terms(geom, a100):
    hw = get_hardware("a100-pcie-40gb")
    fast = CostModel(geom, replace(hw, mem_bw_bytes_s=2 * hw.mem_bw_bytes_s))
    shape = StepShape.from_requests(
        prefill_chunks=((512, 1024),), decode_contexts=(3000,) * 8, checkpoint_copies=1
    )
    slow_c, fast_c = a100.step(shape), fast.step(shape)
    assert fast_c.weights_s == pytest.approx(slow_c.weights_s / 2, rel=1e-12)
    assert fast_c.kv_s == pytest.approx(slow_c.kv_s / 2, rel=1e-12)
    assert fast_c.state_io_s == pytest.approx(slow_c.state_io_s / 2, rel=1e-12)
    assert fast_c.compute_s == slow_c.compute_s
    assert fast_c.bytes == slow_c.bytes


@pytest.mark.parametrize(
    "shape",
    [
        decode(1, 100),
        decode(63, 3000),
        prefill(4096),
        prefill(512, ctx=2048),
        StepShape.from_requests(prefill_chunks=((256, 0),), decode_contexts=(900, 4000)),
        StepShape.from_requests(checkpoint_copies=2, checkpoint_loads=1),
    ],
)
def test_breakdown_sums_to_total(a100, shape):
    c = a100.step(shape)
    memory = c.weights_s + c.kv_s + c.state_io_s
    assert c.memory_s == memory
    assert c.total_s == pytest.approx(max(memory, c.compute_s) + c.overhead_s, rel=1e-12)
    assert c.bound == ("compute" if c.compute_s > memory else "memory")
    assert c.overhead_s == OVERHEAD
    assert c.bytes == pytest.approx(memory * A100_RATE, rel=1e-12)


def test_checkpoint_copies_and_loads_each_cost_one_state_copy(a100):
    base = a100.step(decode(4, 1000))
    more = a100.step(replace(decode(4, 1000), checkpoint_copies=3, checkpoint_loads=2))
    assert more.state_io_s - base.state_io_s == pytest.approx(5 * STATE_RW / A100_RATE, rel=1e-9)
    assert more.kv_s == base.kv_s and more.compute_s == base.compute_s


def test_decode_context_drives_kv_time(a100):
    short, long = a100.step(decode(8, 100)), a100.step(decode(8, 8100))
    assert long.kv_s - short.kv_s == pytest.approx(8 * 8000 * KV_PER_TOKEN / A100_RATE, rel=1e-9)


def test_geometry_weights_bytes_is_used_when_present(geom):
    class WithWeights:
        weights_bytes = 20_000_000_000

        def __getattr__(self, name):
            return getattr(geom, name)

    c = CostModel(WithWeights(), get_hardware("h200")).step(decode(1))
    assert c.compute_s == CostModel(geom, get_hardware("h200")).step(decode(1)).compute_s
    assert c.weights_s == pytest.approx((20e9 - EMB * 2) / (4.8e12 * 0.8), rel=1e-12)


# ---- shape validation ------------------------------------------------------------
def test_from_requests_aggregates():
    s = StepShape.from_requests(
        prefill_chunks=((10, 0), (4, 100)), decode_contexts=(7, 9), checkpoint_copies=1
    )
    assert s == StepShape(
        prefill_tokens=14,
        prefill_attn_pairs=10 * 5.5 + 4 * (100 + 2.5),
        decode_requests=2,
        decode_context_tokens=16,
        prefill_context_tokens=100,
        state_requests=4,
        checkpoint_copies=1,
    )


def test_negative_counts_are_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        replace(decode(2), decode_context_tokens=-1)


def test_empty_step_is_rejected():
    with pytest.raises(ValueError, match="empty StepShape"):
        StepShape.from_requests()


def test_prefill_pairs_without_prefill_tokens_are_rejected():
    with pytest.raises(ValueError, match="no prefill tokens"):
        replace(decode(1), prefill_attn_pairs=5.0)
    with pytest.raises(ValueError, match="prefill_attn_pairs"):
        replace(prefill(16), prefill_attn_pairs=3.0)


# ---- constants ---------------------------------------------------------------------
def test_every_constant_states_its_provenance():
    kinds = ("datasheet", "measured", "assumed", "model config")
    prov = DEFAULTS.provenance()
    assert set(prov) >= {"mem_efficiency", "compute_efficiency", "scan_efficiency", "step_overhead_s"}
    for name, (_, text) in prov.items():
        assert text.startswith(kinds), name


@pytest.mark.parametrize(
    "kw", [{"mem_efficiency": 0.0}, {"compute_efficiency": 1.5}, {"step_overhead_s": -1.0},
           {"vmm_granule_bytes": 0}, {"vmm_remap_s": -1e-6}]
)
def test_bad_constants_raise(kw):
    with pytest.raises(HbenchError, match=next(iter(kw))):
        CostConstants(**kw)


def test_invalid_hardware_raises():
    with pytest.raises(HbenchError, match="must be positive"):
        Hardware(name="x", mem_bw_bytes_s=0, dense_flops_s=1, mem_bytes=1, provenance="")


# ---- CLI -------------------------------------------------------------------------
def test_cli_lists_presets_and_constants():
    r = CliRunner().invoke(cli, ["hardware"])
    assert r.exit_code == 0, r.output
    for name in ("a100-pcie-40gb", "h100-sxm", "h200", "mem_efficiency", "step_overhead_s"):
        assert name in r.output
    assert "1,555" in r.output and "datasheet" in r.output


def test_cli_json_for_one_preset():
    r = CliRunner().invoke(cli, ["hardware", "h100-sxm", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [h["name"] for h in out["hardware"]] == ["h100-sxm"]
    assert out["hardware"][0]["mem_bw_bytes_s"] == 3.35e12
    assert out["cost_constants"]["compute_efficiency"]["value"] == 0.6


def test_cli_unknown_hardware_is_one_line_error():
    r = CliRunner().invoke(cli, ["hardware", "tpu"])
    assert r.exit_code == 2
    assert "Error: unknown hardware 'tpu'" in r.output


def test_moe_compute_counts_routed_experts_only(geom):
    moe = replace(
        geom, n_mlp_layers=0, n_moe_layers=44, n_experts=8, moe_intermediate_size=1024,
        extra={"num_experts_per_tok": 2},
    )
    p = param_counts(moe)
    assert p.body - p.body_active == 44 * (8 - 2) * 3 * 3072 * 1024
    all_routed = param_counts(replace(moe, extra={}))
    assert all_routed.body_active == all_routed.body


def test_cli_model_shows_reference_steps():
    r = CliRunner().invoke(cli, ["hardware", "a100-pcie-40gb", "--model", "falcon-h1-7b", "--json"])
    assert r.exit_code == 0, r.output
    steps = json.loads(r.output)["step_times"]["a100-pcie-40gb"]
    assert steps["decode x1 @100"]["bound"] == "memory"
    assert steps["prefill 4096"]["bound"] == "compute"
    assert steps["decode x1 @100"]["total_s"] == pytest.approx(
        (BODY + EMB) * 2 / A100_RATE + (101 * KV_PER_TOKEN + STATE_RW) / A100_RATE + OVERHEAD,
        rel=1e-9,
    )
