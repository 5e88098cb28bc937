"""Checkpoint policies (`harness.orgs.policies`): where checkpoints are
published and which cached checkpoint is evicted, on tiny pools with exact
expectations. Random histories under the policies are in
tests/unit/harness/orgs/test_orgs_stateful.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from common.errors import HbenchError
from harness.config import RunConfig
from harness.model_configs import preset
from harness.orgs import CheckpointPolicy, build_organization, layout_for
from harness.orgs.keys import chain_keys
from harness.orgs.publish_policy import PUBLISH_POLICIES, Marconi, publish_policy_for
from harness.prefix_flops import active_body_params, prefix_flops, ssm_flops_per_token
from harness.results import list_runs, read_run
from harness.run_setup import validate
from hbench.cli import cli
from tests.support.orgs import serve, tokens

GEOM = preset("falcon-h1-7b")
GRID = 1792            # d0's checkpoint grid


def policy(**kw) -> CheckpointPolicy:
    return CheckpointPolicy(**kw, flops=lambda j: prefix_flops(GEOM, j))


def d0(ckpt_pages: int, **kw):
    return build_organization(layout_for("d0", GEOM), (1000, ckpt_pages), policy(**kw))


# ---- publish ---------------------------------------------------------------------
def test_every_k_reserves_and_publishes_every_kth_boundary_only():
    toks = tokens(4 * GRID + 10, 0)
    keys = chain_keys(toks)
    every, every2 = d0(10), d0(10, publish="every-k", every_k=2)
    # live state + a spare per published boundary: 1 + 4 against 1 + 2
    assert every.pages_needed(0, len(toks), len(toks), keys, None).pages[1] == 5
    assert every2.pages_needed(0, len(toks), len(toks), keys, None).pages[1] == 3
    _, published = serve(every2, 0, toks)
    assert published == [2 * GRID, 4 * GRID]
    assert every2.checkpoint_at(keys, GRID) is None
    assert every2.lookup(keys, len(toks)).j_adopt == 4 * GRID


def test_marconi_publishes_branch_points_and_request_ends():
    shared = tokens(3 * GRID, 0)
    org = d0(20, publish="marconi")
    # the first request: nothing is shared yet, only its end (last boundary)
    _, published = serve(org, 0, shared + tokens(2000, 10**6))
    assert published == [4 * GRID]
    # the second diverges after the shared prefix: its branch point and its end
    keys_b, published = serve(org, 1, shared + tokens(2000, 2 * 10**6))
    assert published == [3 * GRID, 4 * GRID]
    # the third reuses the branch point
    keys_c = chain_keys(shared + tokens(2000, 3 * 10**6))
    assert org.lookup(keys_c, 10**6).j_adopt == 3 * GRID
    # a later turn of the first conversation resumes from its end
    keys_a2 = chain_keys(shared + tokens(2000, 10**6) + tokens(500, 4 * 10**6))
    assert org.lookup(keys_a2, 10**6).j_adopt == 4 * GRID


def test_marconi_counts_a_request_once_and_asking_changes_nothing():
    keys = chain_keys(tokens(3 * GRID, 0))
    m = Marconi()
    assert m.kept(7, keys, 0, 3 * GRID, GRID) == (3 * GRID,)
    assert m.kept(7, keys, 0, 3 * GRID, GRID) == (3 * GRID,) and not m.reached
    m.admitted(7, keys, 3 * GRID, GRID)
    m.admitted(7, keys, 3 * GRID, GRID)       # admitted again after a preemption
    assert sorted(m.reached.values()) == [1, 1, 1]
    assert m.kept(7, keys, 0, 3 * GRID, GRID) == (3 * GRID,)     # itself is no branch
    assert m.kept(8, keys, 0, 3 * GRID, GRID) == (2 * GRID, 3 * GRID)
    assert m.kept(8, keys, GRID, 3 * GRID, GRID) == (2 * GRID, 3 * GRID)   # past a hit at GRID


def test_every_k_counts_from_the_prompt_start():
    p = publish_policy_for("every-k", 3)
    assert p.kept(0, None, 0, 10 * 512, 512) == (3 * 512, 6 * 512, 9 * 512)
    assert p.kept(0, None, 4 * 512, 10 * 512, 512) == (6 * 512, 9 * 512)
    assert publish_policy_for("every", 3).kept(0, None, 512, 1600, 512) == (1024, 1536)
    assert set(PUBLISH_POLICIES) == {"every", "every-k", "marconi"}


# ---- evict -----------------------------------------------------------------------
@pytest.mark.parametrize("evict, alpha, survivor", [
    ("lru", 1.0, "b"),          # the least recently released (A's deep one) goes
    ("utility", 0.0, "b"),      # recency alone: as LRU
    ("utility", 10.0, "a"),     # FLOPs weigh: the shallow, newer one goes
])
def test_utility_eviction_weighs_flops_saved_against_recency(evict, alpha, survivor):
    org = d0(3, evict=evict, alpha=alpha)
    keys_a, _ = serve(org, 0, tokens(2 * GRID + 10, 0))       # cached: A@1792, A@3584
    keys_b, _ = serve(org, 1, tokens(GRID + 10, 10**6))       # evicts A@1792 either way
    assert org.checkpoint_at(keys_a, GRID) is None
    serve(org, 2, tokens(GRID + 10, 2 * 10**6))               # evicts A@3584 or B@1792
    kept = {"a": org.checkpoint_at(keys_a, 2 * GRID) is not None,
            "b": org.checkpoint_at(keys_b, GRID) is not None}
    assert kept == {"a": survivor == "a", "b": survivor == "b"}


def test_prefix_flops_follow_the_geometry():
    g = GEOM
    attn_pair = 4.0 * g.num_attention_heads * g.head_dim * g.n_attn_layers
    per_token = 2.0 * active_body_params(g) + ssm_flops_per_token(g, 256)[0] * g.n_ssm_layers
    assert prefix_flops(g, 0) == 0.0
    assert prefix_flops(g, 1) == pytest.approx(per_token + attn_pair, rel=1e-12)
    # the causal attention term is the only one quadratic in J
    j = 1000
    assert prefix_flops(g, 2 * j) - 2 * prefix_flops(g, j) == pytest.approx(attn_pair * j * j,
                                                                            rel=1e-9)


# ---- configuration -----------------------------------------------------------------
@pytest.mark.parametrize("kw, needle", [
    (dict(ckpt_publish="sometimes"), "--ckpt-publish"),
    (dict(ckpt_evict="fifo"), "--ckpt-evict"),
    (dict(ckpt_every_k=0), "--ckpt-every-k"),
    (dict(utility_alpha=-1.0), "--utility-alpha"),
])
def test_bad_policy_values_are_refused(kw, needle):
    with pytest.raises(HbenchError, match=needle):
        RunConfig(**kw)


def test_policies_are_refused_where_they_cannot_apply():
    with pytest.raises(HbenchError, match="engines sim, torch"):
        validate(RunConfig(engine="vllm", ckpt_evict="utility"))
    with pytest.raises(HbenchError, match="--paging vllm"):
        validate(RunConfig(paging="vllm", ckpt_publish="marconi"))
    validate(RunConfig(paging="vllm", ckpt_evict="utility"))


def test_run_records_the_policies_and_refuses_a_bad_one(tmp_path):
    args = ["run", "--requests", "12", "--rate", "4", "--seed", "3", "--budget", "b63"]
    res = CliRunner().invoke(cli, [*args, "--out", str(tmp_path), "--json",
                                   "--ckpt-publish", "marconi", "--ckpt-evict", "utility",
                                   "--utility-alpha", "2"])
    assert res.exit_code == 0, res.output
    (run,) = list_runs(tmp_path)
    config = read_run(run)["manifest"]["config"]
    assert (config["ckpt_publish"], config["ckpt_evict"], config["utility_alpha"]) == (
        "marconi", "utility", 2.0)
    bad = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "bad"), "--engine", "vllm",
                                   "--endpoint", "http://127.0.0.1:9", "--ckpt-evict", "utility"])
    lines = [ln for ln in bad.output.splitlines() if ln.strip()]
    assert bad.exit_code == 2 and len(lines) == 1 and lines[0].startswith("Error:"), bad.output
