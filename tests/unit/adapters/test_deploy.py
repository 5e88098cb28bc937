"""What hbench advise says to deploy (adapters/deploy.py): the flags are the
numbers hbench's own launchers compute for the budget and cap, and an
organization no engine ships is said to be so."""

from __future__ import annotations

from adapters.deploy import CLOSEST, NONE, SHIPS, check_commands, deployments
from adapters.sglang import memory_limits
from adapters.vllm import block_count_for
from harness.config import RunConfig


def by_engine(org: str, **kw) -> dict:
    config = RunConfig(org=org, budget="55GiB", cap=96, **kw)
    return {d.engine: d for d in deployments(config)}, config


def test_s0_is_stock_vllm_with_the_budgets_blocks_and_the_cap():
    got, config = by_engine("s0", headroom=0.1)
    vllm = got["vLLM"]
    assert vllm.status == SHIPS and vllm.version == "0.32.0"
    flags = list(vllm.flags)
    assert flags[flags.index("--num-gpu-blocks-override") + 1] == str(block_count_for(config, cpu=False))
    assert flags[flags.index("--max-num-seqs") + 1] == "96"
    assert flags[flags.index("--watermark") + 1] == "0.1"
    assert {"--enable-prefix-caching", "align"} <= set(flags)
    assert got["SGLang"].status == NONE


def test_d0_is_sglangs_two_pools_at_the_budget():
    got, config = by_engine("d0", d0_attn_fraction=0.25)
    sglang, limits = got["SGLang"], memory_limits(config)
    assert sglang.status == SHIPS and sglang.version == "0.5.23"
    assert sglang.flags == ("--max-running-requests", "96",
                            "--max-total-tokens", str(limits["max_total_tokens"]),
                            "--max-mamba-cache-size", str(limits["max_mamba_cache_size"]))
    assert got["vLLM"].status == CLOSEST


def test_what_no_engine_ships_is_said_plainly():
    for org in ("s1", "s2"):
        got, _ = by_engine(org)
        assert got["vLLM"].status == CLOSEST and "is not shipped" in got["vLLM"].note
        assert got["SGLang"].status == NONE
    got, _ = by_engine("e0")
    assert {d.status for d in got.values()} == {NONE}
    got, _ = by_engine("u0")
    assert got["SGLang"].status == SHIPS and "--enable-unified-memory" in got["SGLang"].flags


def test_the_check_commands_name_the_engine_that_serves_the_organization():
    assert "--engine sglang" in check_commands(RunConfig(org="d0"))[1]
    assert "--engine vllm" in check_commands(RunConfig(org="s0"))[1]
