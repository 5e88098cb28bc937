"""Hostile numbers at every command that reads one: a flag, a budget label, a
grid value, an SLO. Each is refused in one ``Error:`` line with exit 2 and
nothing written: integers thousands of digits long (Python's int() raises
past 4,300), non-ASCII digits (``b８３`` would otherwise read as b83 and name
another cell), infinities spelled ``1e400``, values out of range."""

from __future__ import annotations

import pytest

from common.errors import HbenchError
from common.numbers import MAX_NUMBER_CHARS, parse_float, parse_int
from tests.support.cli import overridden
from tests.support.hostile import in_a_scratch_directory, refused  # noqa: F401 (autouse fixture)

HUGE = "9" * 5000
SMALL = ["--requests", "12", "--rate", "4", "--seed", "3"]



# (flag, value, words the error holds) for `hbench run`.
RUN_FLAGS = [
    ("--requests", HUGE, "characters long"),
    ("--requests", "８３", "ascii"),
    ("--requests", "١٢", "ascii"),
    ("--requests", "-5", ""),
    ("--requests", "", "empty"),
    ("--requests", "12.5", "integer"),
    ("--requests", "1e3", "integer"),
    ("--requests", "99999999999999999999", "must be in"),
    ("--seed", HUGE, "characters long"),
    ("--seed", "３", "ascii"),
    ("--seed", "99999999999999999999", "must be in"),
    ("--cap", "０", "ascii"),
    ("--cap", HUGE, "characters long"),
    ("--cap", "0", "--cap must be >= 1"),
    ("--token-budget", "٨١٩٢", "ascii"),
    ("--token-budget", HUGE, "characters long"),
    ("--contexts", "８", "ascii"),
    ("--mean-input", HUGE, "characters long"),
    ("--max-model-len", "８１９２", "ascii"),
    ("--max-output", "-1", ""),
    ("--retention-threshold", "２", "ascii"),
    ("--warmup", HUGE, "characters long"),
    ("--max-turns", "８", "ascii"),
    ("--rate", "1e400", "finite"),
    ("--rate", "-inf", "finite"),
    ("--rate", "nan", "finite"),
    ("--rate", "４", "ascii"),
    ("--rate", HUGE, "characters long"),
    ("--rate", "0x10", "ascii"),
    ("--rate", "1_000", "ascii"),
    ("--duration", "1e400", "finite"),
    ("--duration", "１０", "ascii"),
    ("--q", "1e400", "finite"),
    ("--q", "０.５", "ascii"),
    ("--headroom", "1e400", "finite"),
    ("--burstiness", "nan", "finite"),
    ("--burstiness", "1e400", "finite"),
    ("--d0-attn-fraction", "inf", "finite"),
    ("--d0-attn-fraction", "０.５", "ascii"),
    ("--think-time", "1e400", "finite"),
    ("--budget", "b８３", "unknown budget"),
    ("--budget", "８３p", "unknown budget"),
    ("--budget", "１２GiB", "unknown budget"),
    ("--budget", "12ＧiB", "unknown budget"),
    ("--budget", "b" + HUGE, "characters long"),
    ("--budget", HUGE + "p", "characters long"),
    ("--budget", HUGE + "GiB", "characters long"),
    ("--budget", "b0", "zero bytes"),
    ("--budget", "b-1", "unknown budget"),
    ("--budget", "", "unknown budget"),
    ("--budget", "1e400GiB", "unknown budget"),
]


@pytest.mark.parametrize("flag, value, words", RUN_FLAGS, ids=lambda v: str(v)[:24])
def test_run_refuses_a_hostile_number(tmp_path, flag, value, words):
    refused(["run", "--out", tmp_path / "out", *overridden(SMALL, [flag, value])], words, watch=tmp_path)


WORKLOAD_FLAGS = [
    ("--requests", HUGE), ("--requests", "８３"), ("--seed", "３"), ("--rate", "1e400"),
    ("--rate", "nan"), ("--q", "inf"), ("--duration", "1e400"), ("--contexts", HUGE),
    ("--mean-input", "３３３２"), ("--max-output", HUGE), ("--burstiness", "1e400"),
]


@pytest.mark.parametrize("flag, value", WORKLOAD_FLAGS, ids=lambda v: str(v)[:24])
def test_workload_build_refuses_a_hostile_number(tmp_path, flag, value):
    refused(["workload", "build", "-o", tmp_path / "w.parquet", "--requests", "8", flag, value],
            watch=tmp_path)


BUDGET_TEXTS = [("b" + HUGE, "characters long"), (HUGE + "p", "characters long"),
                ("b８３", "unknown budget"), ("２５２p", "unknown budget"),
                ("１GiB", "unknown budget"), ("1e400GiB", "unknown budget"),
                ("b99999999999999999999", "exceeds 1 PiB"), ("1.5.5GiB", "unknown budget")]


@pytest.mark.parametrize("text, words", BUDGET_TEXTS, ids=lambda v: str(v)[:24])
def test_budget_refuses_a_hostile_label(text, words):
    refused(["budget", text], words)


@pytest.mark.parametrize("args, words", [
    (["budget", "b83", "--d0-attn-fraction", "1e400"], "--d0-attn-fraction"),
    (["budget", "b83", "--d0-attn-fraction", "０.５"], "--d0-attn-fraction"),
    (["ledger", "--xa", HUGE], "--xa must be a non-negative integer"),
    (["ledger", "--xr", "４"], "--xr must be a non-negative integer"),
    (["ledger", "--xa16", "１６"], "--xa16 must be a non-negative integer"),
    (["ledger", "--d0-attn-fraction", "nan"], "--d0-attn-fraction"),
    (["ledger", "--budget", "b" + HUGE], "characters long"),
], ids=lambda v: str(v)[:40])
def test_budget_and_ledger_refuse_hostile_numbers(args, words):
    refused(args, words)


SWEEP_VALUES = [
    (["--seeds", "1-" + HUGE], "characters"),
    (["--seeds", HUGE], "characters"),
    (["--seeds", "８３"], "not a valid int"),
    (["--seeds", "１-３"], "not a valid int"),
    (["--seeds", "1-99999999999999999999"], "not a valid int"),
    (["--requests", "８"], "not a valid int"),
    (["--cap", "1.5"], "not a valid int"),
    (["--rate", "1e400"], "--rate must be a finite number"),
    (["--rate", "４"], "not a valid float"),
    (["--q", "nan"], "--q must be a finite number"),
    (["--headroom", "-inf"], "finite"),
    (["--budget", "b８３"], "unknown budget"),
    (["--budget", "b" + HUGE], "characters"),
    (["--set", "max_output=" + HUGE], "characters"),
    (["--set", "think_time_s=1e400"], "finite"),
    (["--set", "gpu=" + "x" * 5000], "characters"),
    (["--set", "mean_input=３３３２"], "not a valid int"),
    (["--jobs", "８"], "ascii"),
    (["--jobs", HUGE], "characters long"),
]


@pytest.mark.parametrize("args", [a for a, _ in SWEEP_VALUES], ids=lambda v: str(v)[:30])
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_sweep_refuses_a_hostile_grid_value(tmp_path, args, dry):
    words = dict((tuple(a), w) for a, w in SWEEP_VALUES)[tuple(args)]
    refused(["sweep", "--out", tmp_path / "o", *(["--dry-run"] if dry else []),
             *overridden(["--org", "s2", "--seeds", "1", "--requests", "8"], args)], words, watch=tmp_path)


def test_a_sweep_grid_file_with_hostile_text_values_is_refused(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'org = "s2"\nseed = "1-{HUGE}"\n')
    refused(["sweep", "--grid", grid, "--dry-run", "--out", tmp_path / "o"], "characters",
            watch=tmp_path)


CAPACITY = [
    (["--slo", "ttft_p99<=1e400s"], "finite"),
    (["--slo", "ttft_p99<=1e300s"], "over one day"),
    (["--slo", "ttft_p99<=1.2.3s"], "ascii"),
    (["--slo", "ttft_p99<=" + HUGE + "s"], "characters long"),
    (["--slo", "ttft_p99<=２s"], "cannot read slo"),
    (["--rates", "1,1e400"], "finite"),
    (["--rates", "１"], "ascii"),
    (["--rates", "nan"], "finite"),
    (["--seeds", "1-" + HUGE], "characters"),
    (["--requests", "８"], "ascii"),
    (["--alpha", "nan"], "finite"),
    (["--jobs", HUGE], "characters long"),
]


@pytest.mark.parametrize("args, words", CAPACITY, ids=lambda v: str(v)[:30])
def test_capacity_refuses_a_hostile_number(tmp_path, args, words):
    refused(["capacity", "--out", tmp_path / "cap", *overridden(["--rates", "1", "--seeds", "1"], args)],
            words, watch=tmp_path)


@pytest.mark.parametrize("args", [
    ["analyze", "RESULTS", "--alpha", "1e400"],
    ["analyze", "RESULTS", "--alpha", "０.０５"],
    ["regress", "--baseline", "RESULTS", "--candidate", "RESULTS", "--min-effect", "nan"],
    ["regress", "--baseline", "RESULTS", "--candidate", "RESULTS", "--alpha", "1e400"],
    ["reproduce", "q4", "--quick", "--jobs", "８", "--out", "OUT"],
    ["tiny-model", "-o", "OUT", "--seed", "８"],
    ["tiny-model", "-o", "OUT", "--records", HUGE],
    ["calibrate", "--engine", "torch", "--model", "OUT", "-o", "OUT/p.json", "--repeats", "３"],
    ["calibrate", "--engine", "torch", "--model", "OUT", "-o", "OUT/p.json", "--max-error", "nan"],
    ["verify", "--engine", "torch", "--prompts", "４"],
    ["verify", "--engine", "torch", "--output-len", HUGE],
], ids=lambda v: " ".join(v)[:40])
def test_other_commands_refuse_hostile_numbers(tmp_path, args):
    results = tmp_path / "results"
    results.mkdir()
    refused([a.replace("RESULTS", str(results)).replace("OUT", str(tmp_path / "out"))
             for a in args], watch=tmp_path)


# ------------------------------------------------------------ the parsers

@pytest.mark.parametrize("text", ["８３", HUGE, "", " ", "1.0", "0x1f", "1_0", "+-1", "٣"])
def test_parse_int_refuses(text):
    with pytest.raises(HbenchError):
        parse_int(text, "--n")


@pytest.mark.parametrize("text", ["1e400", "-1e400", "nan", "inf", "Infinity", "４.５", "1,5",
                                  "0x1p3", HUGE, ""])
def test_parse_float_refuses(text):
    with pytest.raises(HbenchError):
        parse_float(text, "--x")


def test_parsers_read_what_a_user_means():
    assert parse_int(" 83 ", "n") == 83 and parse_int("-3", "n") == -3
    assert parse_float("1e-3", "x") == 1e-3 and parse_float(".5", "x") == 0.5
    assert parse_float("3", "x") == 3.0
    assert len("9" * MAX_NUMBER_CHARS) == MAX_NUMBER_CHARS
