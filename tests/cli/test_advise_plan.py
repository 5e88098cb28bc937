"""`hbench advise`'s plan (hbench/advise.py) without running it: which arms a
search holds and in which order, what each arm's runs are set to, and the
settings a doubled-cap probe keeps."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.capacity import parse_slo
from common.errors import HbenchError
from hbench.advise import Arm, Search, cap_probe_arms, parse_ckpt_policy

BASE = {"model": "falcon-h1-7b", "gpu": "a100-pcie-40gb", "budget": "b63",
        "workload_kind": "sharegpt", "requests": 24}


def search(**kw) -> Search:
    args = {"orgs": ("s2", "d0"), "caps": (63,), "fractions": (0.5,), "rates": (1.0, 2.0),
            "seeds": (1, 2), "limits": parse_slo("ttft_p99<=2s"), "base": dict(BASE)}
    return Search(**{**args, **kw})


def test_a_checkpoint_policy_names_its_eviction_or_gets_the_default_one():
    assert parse_ckpt_policy("marconi") == "marconi/lru"
    assert parse_ckpt_policy("every/utility") == "every/utility"
    for bad in ("sometimes", "every/never", ""):
        with pytest.raises(HbenchError, match="--ckpt-policies"):
            parse_ckpt_policy(bad)


def test_every_setting_of_every_axis_is_an_arm_and_the_first_settings_come_first():
    s = search(headrooms=(0.0, 0.19), ckpts=("every/lru", "marconi/lru"))
    arms = s.arms()
    assert len(arms) == 2 * 2 * 2                            # orgs x headrooms x policies
    assert [a.label for a in arms[:2]] == ["s2 cap 63 f 0 ckpt every/lru",
                                           "d0 cap 63 split 0.5 f 0 ckpt every/lru"]
    assert len({a.label for a in arms}) == len(arms)


def test_an_arms_settings_reach_its_runs_config():
    arm = Arm("s2", 63, None, 0.19, "marconi/utility")
    cfg = search(headrooms=(0.19,), ckpts=("marconi/utility",)).configs(arm)[0]
    assert (cfg.org, cfg.cap, cfg.headroom, cfg.ckpt_publish, cfg.ckpt_evict) == \
        ("s2", 63, 0.19, "marconi", "utility")


def test_at_one_rate_each_arm_runs_that_rate_only():
    s = search(at_rate=3.0)
    assert s.grid_rates == (3.0,)
    assert {c.rate for c in s.configs(s.arms()[0])} == {3.0}
    assert len(s.configs(s.arms()[0])) == len(s.seeds)


def test_a_doubled_cap_keeps_each_organizations_best_settings():
    done = [Arm("s2", 63, None, 0.19, "marconi/lru"), Arm("d0", 63, 0.5, 0.19, "marconi/lru"),
            Arm("s2", 63, None, 0.0, "marconi/lru")]
    table = pd.DataFrame({"arm": [a.label for a in done], "org": ["s2", "d0", "s2"],
                          "cap": [63] * 3, "per_seed": ["1: 4", "1: 2", "1: 1"]})
    probe = cap_probe_arms(table, done)
    assert probe == [Arm("s2", 126, None, 0.19, "marconi/lru"),
                     Arm("d0", 126, 0.5, 0.19, "marconi/lru")]
