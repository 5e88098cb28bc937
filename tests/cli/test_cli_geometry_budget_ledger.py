"""End-to-end: hbench geometry / budget / ledger through click's CliRunner."""

from __future__ import annotations

import json

import pytest

from tests.support import FIXTURES
from tests.support.cli import invoke

FIX = FIXTURES / "configs"


def run_json(*args):
    res = invoke(*args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_geometry_json_reports_golden_sizes_and_layouts():
    rep = run_json("geometry", "--model", "falcon-h1-7b")
    assert rep["per_layer"] == {"attention_bytes_per_token": 1024, "ssm_state_bytes": 1_572_864,
                                "conv_state_bytes": 21_504, "checkpoint_bytes": 1_594_368}
    assert rep["whole_model"]["checkpoint_bytes"] == 44 * 1_594_368
    assert rep["layouts"]["s2"]["slab_slots"] == 16
    assert rep["layouts"]["d0"]["grid_tokens"] == 1792
    assert rep["weights"]["weights_bytes"] == 2 * rep["weights"]["param_count"]


def test_geometry_table_shows_bytes_and_kib():
    res = invoke("geometry", "--model", "falcon-h1-7b")
    assert res.exit_code == 0
    for text in ("1,594,368", "1,557", "1,572,864", "32 KiB conv slot", "Weights:"):
        assert text in res.stdout


def test_geometry_from_config_with_fp32_ssm_state():
    rep = run_json("geometry", "--config", FIX / "bamba.json", "--ssm-dtype", "fp32")
    assert rep["per_layer"]["ssm_state_bytes"] == 128 * 64 * 128 * 4
    assert rep["layer_counts"]["attention"] == 3


def test_geometry_of_pure_attention_model_has_no_d0_layout():
    rep = run_json("geometry", "--config", FIX / "llama.json")
    assert sorted(rep["layouts"]) == ["s0", "s1", "s2"]


def test_budget_json_gives_every_org_its_pages():
    rep = run_json("budget", "b83", "--model", "falcon-h1-7b")["orgs"]
    assert rep["s0"]["total_pages"] == 83
    assert rep["s1"]["total_pages"] == rep["s2"]["total_pages"] == 252
    assert [p["name"] for p in rep["d0"]["pools"]] == ["attention", "checkpoint"]
    assert rep["d0"]["d0_attn_fraction"] == 0.5


def test_budget_table_and_fraction_flag():
    res = invoke("budget", "b108", "--d0-attn-fraction", "0.25")
    assert res.exit_code == 0
    assert "328" in res.stdout and "f=0.25" in res.stdout


def test_ledger_json_worked_example_and_d0_feasibility(tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("# one per line\n100\n3332\n\n512\n")
    rep = run_json("ledger", "--model", "falcon-h1-7b", "--xa", 16, "--xr", 4,
                   "--budget", "b83", "--lengths-from", lengths)
    assert [rep["orgs"][o]["allocated_kib"] for o in ("s0", "s1", "s2")] == [31_140, 16_384, 14_848]
    assert rep["delta01_kib"] == 1045 * 16 - 491 * 4
    assert rep["break_even_ratio"] == pytest.approx(491 / 1045)
    assert rep["d0_feasibility"]["feasible"] and rep["x_a16"] == 512
    assert rep["tail_waste"]["s1"]["tokens"] == 412 + (7 * 512 - 3332) + 0


def test_ledger_table_reports_infeasible_d0():
    res = invoke("ledger", "--xa", 0, "--xa16", 0, "--xr", 42, "--budget", "b83")
    assert res.exit_code == 0
    assert "infeasible" in res.stdout and "0.4699" in res.stdout


def test_ledger_pure_attention_shows_kv_budget():
    rep = run_json("ledger", "--config", FIX / "llama.json", "--xa", 2, "--xr", 0,
                   "--budget", "1GiB")
    assert rep["kv_budget"]["retained_tokens"] == 2**30 // (2 * 32 * 8 * 128 * 2)
    # x_A = 2 pages of the rule's 16 tokens (no SSM state), 131,072 B a token
    assert rep["kv_of_x_a"]["whole_model_bytes"] == 2 * 16 * 131072
    assert rep["grid"]["shared_block_tokens"] == 16 and rep["grid"]["source"] == "geometry rule"


@pytest.mark.parametrize("args, words", [
    (("geometry", "--model", "gpt-5"), "unknown model 'gpt-5'"),
    (("geometry", "--config", FIX / "unsupported.json"), "unsupported model_type"),
    (("geometry", "--config", FIX / "missing_field.json"), "lacks required field"),
    (("geometry", "--config", FIX / "not_json.json"), "is not valid JSON"),
    (("geometry", "--config", FIX / "absent.json"), "config file not found"),
    (("geometry", "--model", "falcon-h1-7b", "--config", FIX / "bamba.json"), "not both"),
    (("geometry", "--ssm-dtype", "fp8"), "--ssm-dtype 'fp8'"),
    (("budget", "b0"), "budget 'b0'"),
    (("budget", "lots"), "unknown budget 'lots'"),
    (("budget", "5000TiB"), "exceeds 1 PiB"),
    (("budget", "b83", "--d0-attn-fraction", "1.5"), "--d0-attn-fraction"),
    (("budget", "b83", "--d0-attn-fraction", "half"), "--d0-attn-fraction"),
    (("ledger", "--xa", "-1"), "--xa must be a non-negative integer"),
    (("ledger", "--xr", "four"), "--xr must be a non-negative integer"),
    (("ledger", "--xa", "99999999999"), "absurd"),
    (("ledger", "--budget", "b-1"), "unknown budget"),
    (("ledger", "--config", FIX / "llama.json", "--xr", 1), "no recurrent state"),
    (("ledger", "--lengths-from", FIX / "nope.txt"), "lengths file not found"),
    (("ledger", "--lengths-from", FIX / "bamba.json"), "not a valid JSON list"),
])
def test_bad_input_is_a_one_line_error(args, words):
    res = invoke(*args)
    assert res.exit_code != 0
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert words in lines[0]


def test_bad_lengths_in_file_are_rejected(tmp_path):
    p = tmp_path / "lengths.json"
    p.write_text("[10, -3]")
    res = invoke("ledger", "--lengths-from", p)
    assert res.exit_code == 2 and "non-negative integers" in res.stderr


@pytest.mark.parametrize("cmd, words", [
    ("geometry", "checkpoint"),
    ("budget", "rounding"),
    ("ledger", "Delta01"),
])
def test_help_texts_explain_the_numbers(cmd, words):
    res = invoke(cmd, "--help")
    assert res.exit_code == 0 and words in res.output
