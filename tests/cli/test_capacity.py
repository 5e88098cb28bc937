"""Capacity at an SLO: the pure pieces on hand-made tables, then `hbench
capacity` end to end on a coarse rate grid, checked against the run
directories it wrote (the SLO holds at the found rate and fails one grid
step above it, for every seed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from analysis import capacity as C
from common.errors import HbenchError
from hbench.cli import cli


def test_parse_slo_reads_units_and_refuses_nonsense():
    limits = C.parse_slo("ttft_p99<=2s, tpot_p99<=100ms")
    assert [(x.key, x.seconds) for x in limits] == [("ttft_p99_s", 2.0), ("tpot_p99_s", pytest.approx(0.1))]
    assert str(limits[1]) == "tpot_p99<=100ms"
    for bad in ("", "ttft<=2s", "ttft_p99<2s", "ttft_p99<=2h", "ttft_p99<=1s,ttft_p99<=2s", "ttft_p99<=0s"):
        with pytest.raises(HbenchError):
            C.parse_slo(bad)


def test_meets_slo_needs_every_limit_and_no_failure():
    limits = C.parse_slo("ttft_p99<=2s,tpot_p99<=100ms")
    ok = {"ttft_p99_s": 2.0, "tpot_p99_s": 0.05, "failed": 0, "finished": 10}
    assert C.meets_slo(ok, limits)
    assert not C.meets_slo({**ok, "ttft_p99_s": 2.01}, limits)
    assert not C.meets_slo({**ok, "tpot_p99_s": None}, limits)
    assert not C.meets_slo({**ok, "failed": 1}, limits)


def test_goodput_is_delivered_rate_times_attainment():
    # 5 arrivals 0.5 s apart (2 req/s); 3 of 5 meet TTFT <= 1 s and TPOT <= 0.1 s
    req = pd.DataFrame({"arrival_s": [0, .5, 1, 1.5, 2], "warmup": False,
                        "status": ["finished"] * 4 + ["failed"],
                        "ttft_s": [.5, 2, .8, .9, .1], "tpot_s": [.05, .05, .2, .05, .05],
                        "finish_s": [9] * 5, "e2e_s": [9] * 5, "itl_p99_s": [.05] * 5})
    assert C.goodput(req, C.parse_slo("ttft_p99<=1s,tpot_p99<=100ms")) == pytest.approx(2.0 * 2 / 5)
    assert C.goodput(req, C.parse_slo("ttft_p99<=10s")) == pytest.approx(2.0 * 4 / 5)


def test_seed_capacity_stops_at_the_first_failure():
    assert C.seed_capacity({1: True, 2: True, 4: False, 8: True}) == (2, 4)
    assert C.seed_capacity({1: False, 2: True}) == (0.0, 1)
    assert C.seed_capacity({1: True, 2: True}) == (2, None)


def test_winner_map_crossover_and_table():
    cells = pd.DataFrame([
        {"org": o, "budget": "b63", "rate": r, "seed": s, "meets": r < 3,
         "goodput": g + 0.01 * s}
        for o, gs in (("s2", {1: 1.0, 2: 2.0, 4: 2.0}), ("d0", {1: 0.9, 2: 2.5, 4: 3.0}))
        for r, g in gs.items() for s in (1, 2, 3)])
    wmap = C.winner_map(cells).set_index("rate")
    assert list(wmap["winner"]) == ["s2", "d0", "d0"]
    assert wmap.loc[2.0, "significant"] and wmap.loc[2.0, "runner_up"] == "s2"
    assert C.crossovers(cells) == [{"budget": "b63", "org": "d0", "beats": "s2", "from_rate": 2.0, "p_holm": 0.0}]
    table = C.capacity_table(cells)
    assert list(table["capacity_req_s"]) == [2.0, 2.0]


SLO = "ttft_p99<=2s,tpot_p99<=100ms"


@pytest.mark.slow
def test_capacity_cli_found_rate_holds_and_next_step_fails(tmp_path):
    out = tmp_path / "cap"
    rates = [0.5, 4.0, 32.0]
    args = ["capacity", "--org", "s2", "--budget", "b108", "--rates", ",".join(map(str, rates)),
            "--seeds", "1-2", "--requests", "24", "--slo", SLO, "--out", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "capacity.json").read_text())
    (arm,) = doc["capacity"]
    per_seed = {int(k): float(v) for k, v in (x.split(": ") for x in arm["per_seed"].split(", "))}
    assert set(per_seed) == {1, 2}

    # independent check: read every run directory's summary and apply the SLO by hand
    summaries = {}
    for d in out.iterdir():
        if (d / "summary.json").is_file():
            cfg = json.loads((d / "manifest.json").read_text())["config"]
            summaries[(cfg["seed"], cfg["rate"])] = json.loads((d / "summary.json").read_text())

    def holds(s):
        return s["failed"] == 0 and s["ttft_p99_s"] <= 2.0 and s["tpot_p99_s"] <= 0.1

    tested_next = 0
    for seed, cap in per_seed.items():
        assert cap in rates, f"seed {seed}: capacity {cap} is not a grid rate"
        assert all(holds(summaries[(seed, r)]) for r in rates if r <= cap)
        above = [r for r in rates if r > cap]
        if above:
            assert not holds(summaries[(seed, above[0])]), f"seed {seed}: SLO holds above {cap}"
            tested_next += 1
    assert tested_next == 2, "the grid's top must fail for the test to mean anything"
    assert arm["capacity_req_s"] == pytest.approx(np.mean(list(per_seed.values())))
    assert len(doc["winner_map"]) == len(rates)
    png = (out / "winner_map.png").read_bytes()
    assert png.startswith(b"\x89PNG")

    # a rerun reuses every finished cell and gives the same answer
    runs_before = sorted(p.name for p in out.iterdir() if (p / "summary.json").is_file())
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir() if (p / "summary.json").is_file()) == runs_before
    assert json.loads((out / "capacity.json").read_text())["capacity"] == doc["capacity"]
    sweep = json.loads((out / "sweep.json").read_text())
    assert {c["status"] for c in sweep["cells"]} == {"skipped"}


def test_capacity_cli_refuses_bad_slo(tmp_path):
    res = CliRunner().invoke(cli, ["capacity", "--slo", "ttft<=2", "--out", str(Path(tmp_path) / "c")])
    assert res.exit_code == 2 and res.output.startswith("Error: cannot read SLO term")


def test_runs_at_the_found_capacity_that_are_not_valid_are_named():
    from analysis.capacity import invalid_at_capacity

    cells = pd.DataFrame([
        {"org": "s2", "budget": "b83", "seed": 1, "rate": 1.0, "meets": True, "valid": True},
        {"org": "s2", "budget": "b83", "seed": 1, "rate": 2.0, "meets": True, "valid": False},
        {"org": "s2", "budget": "b83", "seed": 1, "rate": 3.0, "meets": False, "valid": False},
        {"org": "s2", "budget": "b83", "seed": 2, "rate": 1.0, "meets": True, "valid": True},
        {"org": "s2", "budget": "b83", "seed": 2, "rate": 2.0, "meets": False, "valid": False},
    ])
    assert invalid_at_capacity(cells) == ["s2@b83 seed 1 rate 2"]
