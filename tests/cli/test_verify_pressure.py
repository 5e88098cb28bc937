"""The pressure verify's design, budgets and verdicts, without a server.

The runs themselves (stock vLLM, S1, S2, D0 and each one's negative control)
are served in tests/integration/vllm/test_vllm_plugin_integration.py."""

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
    pin_phase_binds,
    state_pages,
)


def test_the_proportional_models_design_and_budgets(model_dir):
    design, geom = model_design(str(model_dir))
    assert design.block_tokens == 1664 and design.vocab_size == 512
    assert (design.prompt_tokens, design.output_tokens) == (1497, 299)
    assert design.peak_attention_blocks == 2 and design.max_model_len == 3 * 1664
    assert [state_pages(o, geom) for o in ("s0", "s1", "s2", "d0")] == [1, 4, 3, 0]
    assert [binding_blocks(design, o, geom) for o in ("s0", "s1", "s2", "d0")] == [10, 19, 16, 19]
    # 4- and 3-page states: the pin phase's sharers are not all admitted
    assert [pin_phase_binds(design, o, geom) for o in ("s0", "s1", "s2", "d0")] == [
        True, False, False, True]


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


@pytest.mark.parametrize("block", [20, 128, 1664, 4096])
@pytest.mark.parametrize("state", [1, 2], ids=lambda s: f"{s}-state-pages")
def test_the_pin_phase_gives_whichever_request_is_preempted_a_joint_hit(block, state):
    """Every sharer starts with the warmed block, prefills one chunk beside
    the others' decodes and crosses its second edge; where a state takes at
    most cap - 2 pages all are admitted (the warmed block and its state held
    once), and at their peak they do not fit."""
    d = PressureDesign(block_tokens=block, vocab_size=50)
    warm, sharers = d.pin_prompts()
    assert len(warm) == block + 1 and len(sharers) == d.cap - 1
    assert all(len(p) == d.sharer_prompt_tokens and p[:block] == warm[:block] for p in sharers)
    assert len({tuple(p[block:]) for p in sharers}) == len(sharers)
    assert d.prompt_tokens + d.cap - 2 <= block            # one chunk beside the decodes
    assert d.sharer_prompt_tokens < 2 * block < d.sharer_prompt_tokens + d.output_tokens
    assert d.sharer_prompt_tokens + d.output_tokens <= d.max_model_len
    usable = (d.cap - 1) * (d.peak_attention_blocks + state)          # binding_blocks - 1
    assert 1 + state + (d.cap - 1) * (1 + state) <= usable < 1 + (d.cap - 1) * (2 + state)
    assert d.pin_prompts() == (warm, sharers)


def run(org="s1", outputs=((1, 2), (3, 4)), preemptions=1, counters=None, checks=(),
        alias=False):
    counters = ({"invalidations_carrier": 1, "pins_taken": 1, "pinned_resumes_with_hit": 1}
                if counters is None else counters)
    resolved = None if org == "s0" else {"org": org}
    return ServedRun(org, 19, alias, outputs, preemptions, resolved,
                     None if org == "s0" else counters, checks, "/tmp/x.log")


def check(hit=(5, 6), miss=(5, 6), hit_cached=1664, miss_cached=0):
    return PromptCheck(0, hit_cached, miss_cached, hit, miss, (0.0,) * 2, (0.0,) * 2)


def report(stock=None, orgs=None, control="diverges"):
    design = PressureDesign(block_tokens=1664, vocab_size=512)
    orgs = orgs or {"s1": run()}
    controls = {"diverges": {org: run(org, ((9, 9), (3, 4)), alias=True) for org in orgs},
                "intact": {org: run(org, alias=True) for org in orgs}, None: {}}[control]
    return PressureReport(design, stock or run("s0"), orgs, controls)


def test_a_bound_matching_run_with_a_diverging_control_proves_something():
    r = report(orgs={"s1": run(), "d0": run("d0")})
    assert not r.divergent() and r.shortfalls() == []
    lines = "\n".join(r.lines())
    assert ("negative control d0 (aliased ids) at 19 blocks: 1 preemptions, 1 pins taken, "
            "1 resumed from a pinned hit: 1/2 outputs changed") in lines
    assert ("negative control s1 (aliased states) at 19 blocks: 1 preemptions, 1 checkpoint "
            "invalidations, 1 pins taken, 1 resumed from a pinned hit, 0 states placed on "
            "another checkpoint's page: 1/2 outputs changed (must be > 0)") in lines


def test_a_different_output_or_a_hit_unlike_its_recompute_diverges():
    assert report(orgs={"s1": run(outputs=((1, 2), (3, 5)))}).divergent()
    assert report(orgs={"s1": run(checks=(check(miss=(5, 7)),))}).divergent()


@pytest.mark.parametrize("case, needle", [
    (dict(stock=run("s0", preemptions=0)), "s0 at 19 blocks preempted nothing"),
    (dict(orgs={"s2": run("s2", preemptions=0)}), "s2 at 19 blocks preempted nothing"),
    (dict(orgs={"s1": run(counters={"pinned_resumes_with_hit": 1})}),
     "evicted no cached checkpoint"),
    (dict(control="intact"), "s1 (aliased states) at 19 blocks left every output intact: "
                             "the check cannot fail for s1"),
    (dict(orgs={"s2": run("s2", counters={"invalidations_member": 3, "pins_taken": 2})}),
     "s2 at 19 blocks: no preempted request resumed from a pinned hit (2 pins taken)"),
    (dict(orgs={"s1": run(checks=(check(hit_cached=0),))}), "reused no prompt tokens"),
    (dict(orgs={"s1": run(checks=(check(miss_cached=1664),))}), "no clean recompute"),
])
def test_a_run_that_proved_nothing_says_why(case, needle):
    why = report(**case).shortfalls()
    assert len(why) == 1 and needle in why[0], why


def test_a_pin_phase_that_cannot_bind_asks_for_no_pinned_resume():
    s1 = run(counters={"invalidations_carrier": 1})
    s1 = ServedRun(*[getattr(s1, f) for f in ("org", "blocks", "aliased", "outputs",
                                               "preemptions", "resolved", "counters", "checks",
                                               "log_path")], pin_binds=False)
    r = report(orgs={"s1": s1})
    assert r.shortfalls() == []
    assert "0 resumed from a pinned hit (the pin phase cannot bind here)" in "\n".join(r.lines())


def test_no_control_is_no_shortfall():
    assert report(control=None).shortfalls() == []


def test_every_organizations_control_must_diverge():
    r = report(orgs={"s1": run(), "s2": run("s2"), "d0": run("d0")})
    r.controls["s2"] = run("s2", alias=True)            # intact: s2's check cannot fail
    assert r.shortfalls() == ["the negative control s2 (aliased states) at 19 blocks left "
                              "every output intact: the check cannot fail for s2"]


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
    assert "--blocks 3 cannot hold one request" in lines[0] and "give at least 5" in lines[0]
