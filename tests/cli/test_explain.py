"""Shared-prefix diagnostics: each reason on a hand-made request table, then
`hbench explain` on simulated runs built so that D0's 1792-token grid misses
a shorter shared prefix (the same stream on S2's 512-token grid is reused)."""

from __future__ import annotations

import json

import pandas as pd
from click.testing import CliRunner

from analysis.explain import diagnose
from hbench.cli import cli
from tests.support.cli import hbench_run


def _req(rid, arrival, first, j, rmax, attn, group=0, prompt=3000, warmup=False):
    return {"request_id": rid, "arrival_s": arrival, "first_token_s": first, "prefix_group": group,
            "prompt_tokens": prompt, "j_adopt": j, "r_max": rmax, "attn_depth": attn, "warmup": warmup}


def test_each_reason_on_a_hand_made_table():
    # shared prefix 2100 tokens, grid 512 -> target 2048
    reqs = pd.DataFrame([
        _req(0, 0.0, 1.0, 0, 0, 0),                 # first of group 0
        _req(1, 0.5, 2.0, 0, 0, 0),                 # admitted at 0.5 < 1.0: producer computing
        _req(2, 3.0, 4.0, 2048, 2048, 2048),        # reused all
        _req(3, 5.0, 6.0, 1024, 1024, 2048),        # checkpoint evicted, attention survived
        _req(4, 7.0, 8.0, 1024, 2048, 1024),        # attention evicted, checkpoint survived
        _req(5, 9.0, 10.0, 0, 0, 0),                # both gone after request 2 reused it
        _req(6, 0.0, 1.0, 0, 0, 0, group=1),        # first of group 1
        _req(7, 2.0, 3.0, 0, 0, 0, group=1),        # both gone, nobody had reused: before first reuse
        _req(8, 0.0, 1.0, 0, 0, 0, group=-1),       # private context: not diagnosed
    ])
    steps = pd.DataFrame({"start_s": [0.0, 0.5], "admitted_ids": ["0,6", "1"]})
    d = diagnose(reqs, steps, shared_tokens=2100, grid=512, block=512, isolate=False).set_index("request_id")
    assert list(d.index) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert d["reason"].to_dict() == {
        0: "first_of_group", 1: "producer_computing", 2: "", 3: "checkpoint_evicted",
        4: "attention_evicted", 5: "evicted_after_reuse", 6: "first_of_group", 7: "evicted_before_reuse"}
    assert (d["target"] == 2048).all()
    iso = diagnose(reqs, steps, shared_tokens=2100, grid=512, block=512, isolate=True)
    assert set(iso["reason"]) == {"isolate", ""}
    short = diagnose(reqs, steps, shared_tokens=300, grid=512, block=512, isolate=False)
    assert set(short["reason"]) == {"shorter_than_block"}
    coarse = diagnose(reqs, steps, shared_tokens=1500, grid=1792, block=16, isolate=False)
    assert set(coarse["reason"]) == {"no_grid_position"}


def run_b108(out, org, *extra):
    """A light run of ``org`` at b108; its directory."""
    return hbench_run(out, "--org", org, "--budget", "b108", "--rate", "1", "--requests", "24",
                      "--seed", "4", "--mean-input", "1200", *extra)[1]


def _explain(run_dir):
    res = CliRunner().invoke(cli, ["explain", run_dir, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_explain_diagnoses_a_grid_that_misses_the_shared_prefix(tmp_path):
    d0 = run_b108(tmp_path / "res", "d0")
    s2 = run_b108(tmp_path / "res", "s2")
    doc = _explain(d0)
    manifest = json.loads(open(f"{d0}/manifest.json").read())
    shared, grid = manifest["workload_meta"]["context_tokens"], manifest["engine_info"]["grid_tokens"]
    assert shared < grid == 1792            # the workload was built so
    assert doc["counts"] == {"no_grid_position": doc["shared_requests"]} and doc["shared_requests"] > 0
    assert "1792" in doc["answer"] and "no checkpoint" in doc["answer"]
    # independently: no shared request of the D0 run reused anything, while the
    # same request stream on S2's 512-token grid reused the prefix
    req_d0 = pd.read_parquet(f"{d0}/requests.parquet")
    req_s2 = pd.read_parquet(f"{s2}/requests.parquet")
    assert (req_d0.loc[req_d0["prefix_group"] >= 0, "reused_tokens"] == 0).all()
    assert (req_s2.loc[req_s2["prefix_group"] >= 0, "reused_tokens"] == shared // 512 * 512).any()
    s2_doc = _explain(s2)
    assert "no_grid_position" not in s2_doc["counts"] and s2_doc["reused_all"] > 0
    # the table on the terminal
    res = CliRunner().invoke(cli, ["explain", d0])
    assert res.exit_code == 0 and "no checkpoint at any grid position" in res.output


def test_explain_names_isolate(tmp_path):
    doc = _explain(run_b108(tmp_path / "res", "s2", "--isolate"))
    assert doc["counts"] == {"isolate": doc["shared_requests"]}


def test_explain_refuses_a_directory_that_is_not_a_run(tmp_path):
    res = CliRunner().invoke(cli, ["explain", str(tmp_path)])
    assert res.exit_code == 2 and res.output.startswith("Error: ")


def test_the_advice_names_the_gap_it_would_close():
    """checkpoint_evicted: reuse stopped at R_max below the target (J_adopt
    equals R_max there), so the advice is about R_max vs the target; the
    attention-evicted case is about attention depth; D0's knob is its fraction."""
    from analysis.explain import answer

    def diag(reason):
        return pd.DataFrame({"reason": [reason, reason, ""]})

    ckpt = answer(diag("checkpoint_evicted"), org="s2", shared_tokens=3000, grid=512, block=512)
    assert "raise R_max to the target" in ckpt and "J_adopt gap" not in ckpt
    assert "smaller --d0-attn-fraction" in answer(diag("checkpoint_evicted"), org="d0",
                                                  shared_tokens=3000, grid=1792, block=16)
    attn = answer(diag("attention_evicted"), org="d0", shared_tokens=3000, grid=1792, block=16)
    assert "attention depth below the target" in attn and "larger --d0-attn-fraction" in attn
