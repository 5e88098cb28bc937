"""Prefix reuse as Marconi reports it (`analysis.reuse`, ``hbench reuse``)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from click.testing import CliRunner

from analysis.reuse import arm_means, reuse_metrics
from harness.model_configs import preset
from harness.prefix_flops import prefix_flops
from hbench.cli import cli

GEOM = preset("falcon-h1-7b")


def test_hit_rates_and_flops_saved_count_measured_requests_only():
    requests = pd.DataFrame({
        "prompt_tokens": [1000, 3000, 2000, 500, 4000],
        "reused_tokens": [0, 1536, 512, 0, 3584],
        "warmup": [False, False, False, False, True],
    })
    m = reuse_metrics(requests, GEOM)
    assert m["token_hit_rate"] == pytest.approx(2048 / 6500)
    assert m["request_hit_rate"] == pytest.approx(2 / 4)
    assert m["flops_saved"] == pytest.approx(prefix_flops(GEOM, 1536) + prefix_flops(GEOM, 512))
    empty = reuse_metrics(requests[requests["warmup"]], GEOM)
    assert math.isnan(empty["token_hit_rate"]) and math.isnan(empty["request_hit_rate"])


def test_arm_means_average_over_seeds_within_an_arm():
    table = pd.DataFrame({"ckpt_publish": ["every", "every", "marconi"], "seed": [1, 2, 1],
                          "token_hit_rate": [0.2, 0.4, 0.5], "request_hit_rate": [0.5, 1.0, 1.0],
                          "flops_saved": [1.0, 3.0, 5.0], "j_adopt_mean": [10.0, 30.0, 50.0],
                          "invalidations_checkpoint": [0, 2, 4], "ttft_p99_s": [1.0, 2.0, 3.0],
                          "throughput_ledger_tok_s": [100.0, 200.0, 300.0]})
    out = arm_means(table).set_index("ckpt_publish")
    assert out.loc["every", "runs"] == 2 and out.loc["every", "token_hit_rate"] == pytest.approx(0.3)
    assert out.loc["marconi", "flops_saved"] == 5.0


def test_reuse_command_reads_the_runs_tables(tmp_path):
    for publish in ("every", "marconi"):
        res = CliRunner().invoke(cli, ["run", "--requests", "12", "--rate", "4", "--seed", "3",
                                       "--ckpt-publish", publish, "--out", str(tmp_path),
                                       "--json"])
        assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["reuse", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["ckpt_publish"] for r in rows] == ["every", "marconi"]
    for r in rows:
        assert 0 <= r["token_hit_rate"] <= 1 and 0 <= r["request_hit_rate"] <= 1
        assert (r["flops_saved"] > 0) == (r["token_hit_rate"] > 0)
    bad = CliRunner().invoke(cli, ["reuse", str(tmp_path / "none")])
    assert bad.exit_code == 2 and bad.output.startswith("Error:")
