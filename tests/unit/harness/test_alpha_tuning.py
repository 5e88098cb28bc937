"""Marconi's online tuning of the utility eviction's alpha (`harness.orgs.alpha_tuning`,
``--utility-alpha auto``): the bootstrap window, the replay and its choice,
the flag, the config and what a run records."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from common.errors import HbenchError
from harness.config import RunConfig
from harness.grid import parse_values
from harness.model_configs import preset
from harness.orgs import CheckpointPolicy, build_organization, layout_for
from harness.orgs.alpha_tuning import BOOTSTRAP_MULTIPLIER, CANDIDATES, AlphaTuner
from harness.orgs.evict_policy import Utility
from harness.orgs.keys import chain_keys
from harness.prefix_flops import prefix_flops
from harness.results import list_runs, read_run
from hbench.cli import cli

GEOM = preset("falcon-h1-7b")


class Scored(AlphaTuner):
    """A tuner whose replay scores each candidate by a given function (no organization)."""

    def __init__(self, score):
        super().__init__(lambda j: float(j))
        self.score, self.replayed = score, []

    def replay(self, alpha):
        self.replayed.append(alpha)
        return self.score(alpha), 0, 0


def test_the_window_is_five_times_the_requests_before_the_first_eviction():
    t = Scored(lambda a: -(a - 1.3) ** 2)
    for i in range(7):
        assert t.seen(i, [1, 2], 32, 0) is None
    assert t.window_size is None and not t.replayed
    t.evicting()
    t.evicting()                      # only the first eviction sets the window
    assert t.window_size == BOOTSTRAP_MULTIPLIER * 7 == 35
    t.seen(3, [1, 2], 32, 0)          # a request seen before counts once
    for i in range(7, 34):
        assert t.seen(i, [1, 2], 32, 0) is None
    assert t.tuned_alpha is None and not t.replayed
    assert t.seen(34, [1, 2], 32, 0) == 1.3       # the 35th request: replay, best FLOPs
    assert t.replayed == list(CANDIDATES)
    assert t.counters() == {"utility_alpha_tuned": 1.3, "utility_alpha_tuned_at": 35}
    assert t.seen(35, [1, 2], 32, 0) is None and len(t.replayed) == 21   # tuned once


def test_ties_go_to_the_smallest_alpha():
    t = Scored(lambda a: 5.0)
    t.seen(0, [1], 16, 0)
    t.evicting()
    for i in range(1, BOOTSTRAP_MULTIPLIER):
        t.seen(i, [1], 16, 0)
    assert t.tuned_alpha == 0.0 and t.tuned_at == BOOTSTRAP_MULTIPLIER


def test_the_utility_policy_serves_with_zero_then_the_tuned_alpha():
    t = Scored(lambda a: a if a <= 0.7 else -a)
    u = Utility(0.0, t.flops, t)
    u.admitted("a", [1], 16, 0)
    u.tuner.evicting()
    assert u.alpha == 0.0
    for i in range(BOOTSTRAP_MULTIPLIER - 2):
        u.admitted(i, [1], 16, 0)
    assert u.alpha == 0.0
    u.admitted("last", [1], 16, 0)
    assert u.alpha == 0.7


class Recording:
    """An organization stand-in that fits ``room`` live requests and records calls."""

    def __init__(self, room):
        self.room, self.live, self.log = room, [], []

    def lookup(self, keys, max_tokens):
        from harness.orgs.values import PrefixHit
        return PrefixHit(j_adopt=16 if keys[0] == 7 else 0, r_max=0, attn_depth=0)

    def allocate(self, rid, end, prefill_until, keys, hit, prompt_len):
        if len(self.live) >= self.room:
            return False
        self.live.append(rid)
        return True

    def commit(self, rid, keys, computed, prefill_until):
        self.log.append(("commit", rid, computed))

    def end_step(self):
        pass

    def finish(self, rid):
        self.live.remove(rid)
        self.log.append(("finish", rid))


def test_the_replay_keeps_as_many_requests_live_as_ran_at_admission():
    t = AlphaTuner(lambda j: 10.0 * j)
    org = Recording(room=2)
    t.build = lambda alpha: org
    # (rid, keys, prompt length, requests running at admission)
    t.window = [("a", (7,), 32, 0), ("b", (1,), 32, 1), ("c", (7,), 32, 1), ("d", (7,), 32, 5)]
    flops, tokens, hits = t.replay(0.5)
    # c ran with one other: a is finished first; d had five running but room for two:
    # the oldest live (b) is finished until d fits
    assert [e for e in org.log if e[0] == "finish"] == [("finish", "a"), ("finish", "b")]
    assert org.live == ["c", "d"]
    assert (flops, tokens, hits) == (3 * 160.0, 48, 3)


def test_an_org_built_with_auto_tunes_through_fresh_copies_of_itself():
    pol = CheckpointPolicy(evict="utility", alpha="auto", flops=lambda j: prefix_flops(GEOM, j))
    org = build_organization(layout_for("d0", GEOM), (400, 3), pol)
    ev = org.table.evict
    assert ev.alpha == 0.0 and ev.tuner is not None
    copy = ev.tuner.build(0.4)
    assert type(copy) is type(org) and copy.table.evict.alpha == 0.4
    assert copy.table.evict.tuner is None                 # a copy's alpha is fixed
    # serve distinct prompts one at a time: the 3-unit checkpoint pool fills,
    # the first eviction sets the window, and its last request tunes
    for i in range(40):
        toks = [i * 10_000 + k for k in range(1800)]
        keys = chain_keys(toks)
        assert org.allocate(i, 1800, 1800, keys, org.lookup(keys, 1799))
        org.commit(i, keys, 1800, 1800)
        org.end_step()
        org.finish(i)
        org.check_invariants()
    n0 = ev.tuner.before_eviction
    assert n0 is not None and ev.tuner.tuned_at == BOOTSTRAP_MULTIPLIER * n0
    # nothing is ever reused, so every candidate saves nothing: the tie goes to 0
    assert ev.alpha == 0.0 and set(ev.tuner.scores.values()) == {(0, 0, 0)}
    assert org.policy_counters() == {"utility_alpha_tuned": 0.0,
                                     "utility_alpha_tuned_at": BOOTSTRAP_MULTIPLIER * n0}


def test_config_flag_and_grid_take_auto():
    assert RunConfig(ckpt_evict="utility", utility_alpha="auto").utility_alpha == "auto"
    with pytest.raises(HbenchError, match="--utility-alpha"):
        RunConfig(utility_alpha="often")
    with pytest.raises(HbenchError, match="--utility-alpha"):
        RunConfig(utility_alpha=-0.5)
    assert parse_values("utility_alpha", "auto,0.5") == ("auto", 0.5)
    res = CliRunner().invoke(cli, ["run", "--utility-alpha", "often", "--out", "/nonexistent"])
    assert res.exit_code != 0 and "--utility-alpha" in res.output


def test_a_run_records_auto_and_the_alpha_it_chose(tmp_path):
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--json", "--org", "s1",
                                   "--budget", "b63", "--rate", "3", "--seed", "1",
                                   "--requests", "80", "--ckpt-evict", "utility",
                                   "--utility-alpha", "auto"])
    assert res.exit_code == 0, res.output
    (path,) = list_runs(tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["config"]["utility_alpha"] == "auto"
    s = read_run(path)["summary"]
    assert s["utility_alpha_tuned"] in CANDIDATES
    assert s["utility_alpha_tuned_at"] % BOOTSTRAP_MULTIPLIER == 0
