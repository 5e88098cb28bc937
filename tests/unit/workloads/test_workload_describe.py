"""`workloads.describe`: shareable prefixes against the organizations' grids,
checked on hand-built workloads whose answers follow from the definitions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workloads.describe import all_turns, history_growth, sharing_structure
from workloads.multiturn.session import Session, Turn
from workloads.workload import Workload, WorkloadRequest


def req(i, n, group=-1, prefix=0, salt=None, out=10):
    return WorkloadRequest(request_id=i, arrival_s=float(i), prompt_text="x",
                           prompt_token_ids=np.zeros(n, dtype=np.int64), output_len=out,
                           prefix_group=group, prefix_tokens=prefix, salt=salt)


def test_shared_contexts_count_from_their_second_use_and_are_cut_at_the_grid():
    w = Workload(requests=(req(0, 1100, 0, 1000), req(1, 1100, 0, 1000), req(2, 1100, 0, 1000),
                           req(3, 1100)))
    s = sharing_structure(w, {"s1": 512, "d0": 1792})
    assert s["prompt_tokens"] == 4400 and s["sharing_requests"] == 2
    assert s["shareable_tokens"] == 2000 and s["shareable_fraction"] == 2000 / 4400
    assert s["orgs"]["s1"] == {"grid_tokens": 512, "reusable_tokens": 1024,
                               "reusable_fraction": 1024 / 4400, "beyond_grid_tokens": 976,
                               "beyond_grid_mean": 488.0, "below_one_grid": 0}
    assert s["orgs"]["d0"]["reusable_tokens"] == 0 and s["orgs"]["d0"]["below_one_grid"] == 2


def test_isolated_requests_share_nothing():
    w = Workload(requests=(req(0, 900, 0, 800, salt="a"), req(1, 900, 0, 800, salt="b")))
    assert sharing_structure(w, {"s1": 512})["shareable_tokens"] == 0


def test_a_later_turn_can_reuse_the_whole_previous_turn():
    t1 = Turn(request_id=1, user_token_ids=np.zeros(50, dtype=np.int64), user_text="",
              answer_token_ids=np.zeros(0, dtype=np.int64), answer_text="", output_len=20,
              think_s=1.0, prompt_len=600 + 400 + 50)
    t2 = Turn(request_id=2, user_token_ids=np.zeros(30, dtype=np.int64), user_text="",
              answer_token_ids=np.zeros(0, dtype=np.int64), answer_text="", output_len=5,
              think_s=1.0, prompt_len=1050 + 20 + 30)
    w = Workload(requests=(req(0, 600, out=400),), sessions=(Session(0, 0, (t1, t2)),))
    s = sharing_structure(w, {"s1": 512})
    assert s["shareable_tokens"] == 1000 + 1070
    assert s["orgs"]["s1"]["reusable_tokens"] == 512 + 1024
    assert [g["prompt_mean"] for g in history_growth(w)] == [600, 1050, 1100]
    assert [g["history_mean"] for g in history_growth(w)] == [0, 1000, 1070]
    assert history_growth(Workload(requests=(req(0, 10),))) == []
    # every turn counted: 600 + 1050 + 1100 prompt tokens, 2070 of them history
    assert all_turns(w) == {"turns": 3, "later_turns": 2, "prompt_tokens": 2750,
                            "output_tokens": 425, "history_tokens": 2070,
                            "history_fraction": 2070 / 2750}
    assert all_turns(Workload(requests=(req(0, 10),))) is None


def test_grids_come_from_the_organizations_layouts():
    from hbench.commands.workload import org_grids

    # the unified and elastic pools keep D0's checkpoint interval
    assert org_grids() == {"s0": 512, "s1": 512, "s2": 512, "d0": 1792, "u0": 1792, "e0": 1792}


@pytest.mark.parametrize("kind", ["sharegpt", "multiturn"])
def test_describe_cli_shows_the_grid_table_and_writes_the_figure(tmp_path, kind):
    from click.testing import CliRunner

    from hbench.cli import cli

    out, png = tmp_path / "w.parquet", tmp_path / "sharing.png"
    runner = CliRunner()
    res = runner.invoke(cli, ["workload", "build", "--workload-kind", kind, "--requests", "12",
                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["workload", "describe", str(out), "--sharing-png", str(png)])
    assert res.exit_code == 0, res.output
    assert "beyond last" in res.output and "1792" in res.output
    assert ("history growth" in res.output) == (kind == "multiturn")
    assert png.stat().st_size > 0
    res = runner.invoke(cli, ["workload", "describe", str(out), "--json"])
    s = json.loads(res.output)
    assert s["sharing"]["orgs"]["d0"]["grid_tokens"] == 1792
    assert s["sharing"]["orgs"]["s2"]["reusable_fraction"] >= s["sharing"]["orgs"]["d0"][
        "reusable_fraction"]
