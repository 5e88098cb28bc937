"""`hbench run` ends a run that is not valid with one line saying why and the
command that finds a rate that is; a valid run prints no such line.

The command is run as printed (shlex-split, only ``--out`` added; on the
torch engine, which really computes, one cell of its grid): every run it
makes must have the configuration of the run it follows, but for the rate
and the seed it searches.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.results import list_runs, read_run
from hbench.cli import cli
from hbench.commands.run import next_step
from hbench.suggest import capacity_command, changed_fields, value_text
from tests.support.cli import invoke, one_error_line, overridden

UNWRITABLE = "/dev/null/out"
COMMAND_AFTER = "find the rates it sustains in a steady state with: "


def run_output(tmp_path, *args):
    """``hbench run``'s printed answer (S2 at b63, 60 requests, seed 3, unless
    ``args`` say otherwise)."""
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), *overridden(
        ["--org", "s2", "--budget", "b63", "--requests", "60", "--seed", "3"], args)])
    assert res.exit_code == 0, res.output
    return res.output


def overloaded_run(tmp_path, *args) -> tuple[list[str], dict]:
    """Run ``hbench run ARGS`` (which must end not valid for its load); the
    suggested command's argv and the run's recorded config."""
    res = invoke("run", "--out", tmp_path / "run", *args)
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if COMMAND_AFTER in x]
    (run_dir,) = list_runs(tmp_path / "run")
    return shlex.split(line.split(COMMAND_AFTER, 1)[1]), read_run(run_dir)["manifest"]["config"]


def run_suggestion(argv: list[str], out: Path) -> list[dict]:
    """The suggested command, run as printed with ``--out OUT``; the recorded
    config of every run it made."""
    assert argv[:2] == ["hbench", "capacity"] and "--out" not in argv, argv
    res = CliRunner().invoke(cli, [*argv[1:], "--out", str(out)])
    assert res.exit_code == 0, res.output
    cells = json.loads((out / "sweep.json").read_text())["cells"]
    return [read_run(out / c["cell_id"])["manifest"]["config"] for c in cells]


def assert_same_runs(original: dict, configs: list[dict], rates: set[float],
                     seeds: set[int] = frozenset({1, 2, 3})) -> None:
    """Each run the suggestion made is the original run but for its rate and
    seed, which cover the suggested grid."""
    assert len(configs) == len(rates) * len(seeds)
    for cfg in configs:
        differ = {k for k in original if cfg.get(k) != original[k]}
        assert differ <= {"rate", "seed"}, {k: (original[k], cfg.get(k)) for k in differ}
    assert {c["rate"] for c in configs} == rates and {c["seed"] for c in configs} == seeds


# a simulated H100 with 2,000-token prompts, overloaded at b20
H100 = ["--org", "s2", "--budget", "b20", "--rate", "20", "--gpu", "h100-sxm",
        "--mean-input", "2000", "--requests", "24", "--seed", "3"]


def test_overloaded_run_ends_with_the_capacity_command_for_its_arm(tmp_path):
    out = run_output(tmp_path, "--rate", "20")
    lines = [x for x in out.splitlines() if x.startswith(("not valid (", "latency not valid ("))]
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith("latency not valid (overload): 20.0 req/s is more than S2 at b63 sustains")
    assert "its throughput is the sustained service rate" in line
    assert line.endswith("hbench capacity --org s2 --budget b63 --rates 5,10,15,20 --seeds 1-3 --requests 60")


def test_the_suggestion_carries_every_setting_of_the_run(tmp_path):
    argv, cfg = overloaded_run(tmp_path, *H100)
    text = shlex.join(argv)
    assert "--set gpu=h100-sxm" in text and "--set mean_input=2000" in text
    assert "--requests 24" in text and "--rates 5,10,15,20" in text
    # as printed, capacity takes it (the next check is where its output goes)
    one_error_line(invoke(*argv[1:], "--out", UNWRITABLE), f"--out {UNWRITABLE}")


@pytest.mark.slow
def test_the_suggestion_run_as_printed_measures_the_same_arm(tmp_path):
    argv, original = overloaded_run(tmp_path, *H100)
    assert_same_runs(original, run_suggestion(argv, tmp_path / "cap"), {5.0, 10.0, 15.0, 20.0})


@pytest.mark.slow
def test_a_multiturn_runs_suggestion_keeps_its_sessions(tmp_path):
    argv, original = overloaded_run(tmp_path, "--org", "s2", "--budget", "b20", "--rate", "20",
                                    "--workload-kind", "multiturn", "--requests", "24",
                                    "--think-time", "0.5", "--max-turns", "3", "--seed", "3")
    assert {"workload_kind", "think_time_s", "max_turns"} <= set(changed_fields(original))
    assert_same_runs(original, run_suggestion(argv, tmp_path / "cap"), {5.0, 10.0, 15.0, 20.0})


@pytest.mark.slow
def test_a_duration_runs_suggestion_keeps_its_duration_not_a_request_count(tmp_path):
    argv, original = overloaded_run(tmp_path, "--org", "s2", "--budget", "b20", "--rate", "20",
                                    "--duration", "1.5", "--seed", "3")
    assert "--requests" not in argv and "duration_s=1.5" in argv
    assert_same_runs(original, run_suggestion(argv, tmp_path / "cap"), {5.0, 10.0, 15.0, 20.0})


@pytest.mark.slow
def test_the_torch_example_suggestion_runs_on_the_torch_engine(tmp_path):
    """README's torch example, smaller: the suggestion searches the same model
    directory on the same engine (it used to search the default preset on the
    simulator, which refused the budget)."""
    model = tmp_path / "prop"
    assert invoke("tiny-model", "--preset", "proportional", "-o", model).exit_code == 0
    argv, original = overloaded_run(
        tmp_path, "--engine", "torch", "--org", "s2", "--budget", "b6", "--model", model,
        "--requests", "48", "--rate", "20", "--mean-input", "1000", "--max-output", "16",
        "--contexts", "4", "--max-model-len", "2048")
    assert {"engine", "model", "config_path"} <= set(changed_fields(original))
    # one cell of the suggested grid (every torch run really computes)
    rates, seeds = argv.index("--rates") + 1, argv.index("--seeds") + 1
    assert (argv[rates], argv[seeds]) == ("5,10,15,20", "1-3")
    argv[rates], argv[seeds] = "10", "2"
    assert_same_runs(original, run_suggestion(argv, tmp_path / "cap"), {10.0}, {2})


def test_a_saved_workload_run_says_what_capacity_cannot_carry():
    cfg = {"org": "s2", "budget": "b83", "rate": 3.0, "requests": 240,
           "workload_path": "runs/w.parquet"}
    summary = {"validity": {"valid": False, "reasons": ["overload"], "checks": {}}}
    line = next_step(summary, cfg)
    assert "hbench capacity --" not in line
    assert line.endswith("hbench capacity cannot search rates with this run's --workload "
                         "runs/w.parquet (a saved workload keeps the rate it was built with)")


def test_a_value_no_text_reads_back_to_is_named_not_dropped():
    step = capacity_command({"org": "s2", "budget": "b83", "rate": 3.0, "requests": 240,
                             "dataset": "corpora/a,b.jsonl"}, [1.0, 2.0])
    assert step.command is None and step.uncarried == (
        "dataset='corpora/a,b.jsonl' (not expressible as --set dataset=VALUE)",)


def test_values_are_written_so_that_they_read_back():
    assert value_text("utility_alpha", "auto") == "auto"
    assert value_text("think_time_s", 0.1 + 0.2) == repr(0.1 + 0.2)
    assert value_text("retention", True) == "true"
    assert value_text("dataset", "a,b") is None
    step = capacity_command({"org": "s2", "budget": "b83", "rate": 3.0, "requests": 240,
                             "model": "my models/prop", "ckpt_evict": "utility"}, [3.0])
    assert step.command == ("hbench capacity --org s2 --budget b83 --rates 3 --seeds 1-3 "
                            "--requests 240 --set 'model=my models/prop' --ckpt-evict utility")


def test_valid_run_prints_no_next_step(tmp_path):
    out = run_output(tmp_path, "--rate", "0.5", "--requests", "30")
    assert "not valid (" not in out and "hbench capacity" not in out


def test_a_failure_that_no_rate_fixes_does_not_point_at_capacity():
    summary = {"validity": {"valid": False, "reasons": ["failures"], "checks": {}}}
    line = next_step(summary, {"org": "s2", "budget": "b83", "rate": 3.0, "requests": 240})
    assert line.startswith("not valid (failures)") and "capacity" not in line
    assert next_step({"validity": {"valid": True, "reasons": []}}, {}) == ""
