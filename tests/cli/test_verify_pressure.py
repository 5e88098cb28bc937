"""The pressure verify's design, budgets and verdicts, without a server.

The runs themselves (stock vLLM, S1, S2, D0 and the aliased-D0 control) are
served in tests/integration/vllm/test_vllm_plugin_integration.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hbench.cli import cli
from hbench.verify import PromptCheck
from hbench.verify_pressure import (
    PressureDesign,
    PressureReport,
    ServedRun,
    binding_blocks,
    d0_fraction,
    model_design,
    state_pages,
)


def test_the_proportional_models_design_and_budgets(model_dir):
    design, geom = model_design(str(model_dir))
    assert design.block_tokens == 1664 and design.vocab_size == 512
    assert (design.prompt_tokens, design.output_tokens) == (1497, 299)
    assert design.peak_attention_blocks == 2 and design.max_model_len == 2 * 1664
    assert [state_pages(o, geom) for o in ("s0", "s1", "s2", "d0")] == [1, 4, 3, 0]
    assert [binding_blocks(design, o, geom) for o in ("s0", "s1", "s2", "d0")] == [10, 19, 16, 19]


@pytest.mark.parametrize("block", [20, 128, 1664, 4096])
def test_every_prompt_is_admitted_in_one_block_and_crosses_its_edge(block):
    from harness.budget import vllm_d0_split

    d = PressureDesign(block_tokens=block, vocab_size=50)
    ps = d.prompts()
    assert all(len(p) == d.prompt_tokens < block < d.prompt_tokens + d.output_tokens for p in ps)
    assert all(10 <= t < 50 for p in ps for t in p)
    assert ps[0][:d.prompt_tokens // 2] == ps[2][:d.prompt_tokens // 2] != ps[1][:d.prompt_tokens // 2]
    assert d.prompts() == ps and len(d.hit_prompts()[0]) == block + block // 2
    assert d.max_model_len >= d.hit_prompt_tokens + 16
    # D0's attention pool holds cap - 1 requests' peak, not cap
    blocks = 1 + 3 * (d.peak_attention_blocks + 4)
    attn, _ = vllm_d0_split(blocks, d0_fraction(d, blocks))
    assert attn == 3 * d.peak_attention_blocks


def run(org="s1", outputs=((1, 2), (3, 4)), preemptions=1, counters=None, checks=(),
        alias=False):
    counters = {"invalidations_carrier": 1} if counters is None else counters
    resolved = None if org == "s0" else {"org": org}
    return ServedRun(org, 19, alias, outputs, preemptions, resolved,
                     None if org == "s0" else counters, checks, "/tmp/x.log")


def check(hit=(5, 6), miss=(5, 6), hit_cached=1664, miss_cached=0):
    return PromptCheck(0, hit_cached, miss_cached, hit, miss, (0.0,) * 2, (0.0,) * 2)


def report(stock=None, orgs=None, control="diverges"):
    design = PressureDesign(block_tokens=1664, vocab_size=512)
    control = {"diverges": run("d0", ((9, 9), (3, 4)), alias=True),
               "intact": run("d0", alias=True), None: None}[control]
    return PressureReport(design, stock or run("s0"), orgs or {"s1": run()}, control)


def test_a_bound_matching_run_with_a_diverging_control_proves_something():
    r = report()
    assert not r.divergent() and r.shortfalls() == []
    assert ("negative control d0 (aliased ids) at 19 blocks: 1 preemptions: 1/2 outputs "
            "changed") in "\n".join(r.lines())


def test_a_different_output_or_a_hit_unlike_its_recompute_diverges():
    assert report(orgs={"s1": run(outputs=((1, 2), (3, 5)))}).divergent()
    assert report(orgs={"s1": run(checks=(check(miss=(5, 7)),))}).divergent()


@pytest.mark.parametrize("case, needle", [
    (dict(stock=run("s0", preemptions=0)), "s0 at 19 blocks preempted nothing"),
    (dict(orgs={"s2": run("s2", preemptions=0)}), "s2 at 19 blocks preempted nothing"),
    (dict(orgs={"s1": run(counters={})}), "evicted no cached checkpoint"),
    (dict(control="intact"), "the check cannot fail"),
    (dict(orgs={"s1": run(checks=(check(hit_cached=0),))}), "reused no prompt tokens"),
    (dict(orgs={"s1": run(checks=(check(miss_cached=1664),))}), "no clean recompute"),
])
def test_a_run_that_proved_nothing_says_why(case, needle):
    why = report(**case).shortfalls()
    assert len(why) == 1 and needle in why[0], why


def test_no_control_is_no_shortfall():
    assert report(control=None).shortfalls() == []


@pytest.mark.parametrize("args, needle", [
    (["--engine", "torch", "--org", "s1", "--org", "s2", "--model", "x"], "--org is given once"),
    (["--endpoint", "http://127.0.0.1:9", "--blocks", "10"], "--blocks applies to --engine vllm --launch only"),
    (["--launch", "--model", "/nonexistent-model-dir", "--org", "s0"], "no geometry"),
])
def test_bad_verify_flags_are_one_error_line(args, needle):
    res = CliRunner().invoke(cli, ["verify", *args])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("Error:"), res.output
    assert needle in lines[0], lines[0]


def test_a_budget_no_server_can_serve_is_refused_before_any_starts(model_dir):
    res = CliRunner().invoke(cli, ["verify", "--launch", "--model", str(model_dir),
                                   "--blocks", "3"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("Error:"), res.output
    assert "--blocks 3 cannot hold one request" in lines[0] and "give at least 4" in lines[0]
