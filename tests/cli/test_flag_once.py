"""Every setting is given once (`hbench.flag_once`): a single-valued flag
given twice, or a field set by its flag and by ``--set`` (or by ``--set``
twice), is refused in one line before any work, where click alone would keep
the last; flags meant to repeat still do; and a budget or organization in
any spelling is stored as its canonical label."""

from __future__ import annotations

import json

import click
import pytest

from hbench.commands.run import run
from hbench.commands.sweep import sweep
from hbench.flag_once import repeated_option, set_fields
from tests.support.cli import hbench_run, invoke, one_error_line


@pytest.mark.parametrize("args, flag", [
    (["--seed", "1", "--seed", "2"], "--seed"),
    (["--seed=1", "--seed", "2"], "--seed"),
    (["--org", "s2", "--budget", "b83", "--org=d0"], "--org"),
    (["--dataset", "--seed", "--seed", "3"], None),   # a value that looks like a flag is a value
    (["--json", "--json"], None),                      # an on/off flag twice says the same
    (["--seed", "1", "--", "--seed"], None),
])
def test_repeated_option_reads_args_as_click_does(args, flag):
    assert repeated_option(run, args) == flag


def test_a_short_option_counts_as_its_long_one():
    assert repeated_option(sweep, ["-j", "2", "--jobs=3"]) == "--jobs"
    assert repeated_option(sweep, ["-j2", "-j3"]) == "-j"
    assert repeated_option(sweep, ["--set", "a=1", "--set", "b=2"]) is None   # meant to repeat


@pytest.mark.parametrize("args, needle", [
    (["sweep", "--seeds", "1-3", "--seeds", "4-6", "--dry-run"], "--seeds was given more than once"),
    (["run", "--requests", "4", "--seed", "1", "--seed", "2"], "--seed was given more than once"),
    (["workload", "build", "--seed", "1", "--seed", "2", "--out", "w.json"], "--seed was given"),
    (["analyze", "x", "--alpha", "0.05", "--alpha", "0.1"], "--alpha was given"),
    (["sweep", "--set", "org=s2", "--org", "d0", "--dry-run"], "org is set both by --org and by --set org"),
    (["sweep", "--set", "org=s2", "--set", "org=d0", "--dry-run"], "--set org was given more than once"),
    (["sweep", "--set", "max-output=64", "--set", "max_output=128", "--dry-run"],
     "--set max_output was given more than once"),
    (["capacity", "--set", "org=s2", "--slo", "ttft_p99<=5s"], "org is set both by --org and by --set org"),
    (["capacity", "--requests", "4", "--set", "requests=8", "--slo", "ttft_p99<=5s"],
     "requests is set both by --requests"),
])
def test_a_setting_given_twice_is_refused_in_one_line(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    one_error_line(invoke(*args, "--out", tmp_path / "o") if args[0] in ("sweep", "capacity")
                   else invoke(*args), needle)
    assert not (tmp_path / "o").exists() and not (tmp_path / "w.json").exists()


def test_set_fields_reads_items_and_keeps_the_flags_it_is_told_of():
    assert set_fields(["max-output=64", "cap= 3"], {"org": "--org"}) == {"max_output": "64", "cap": " 3"}
    with pytest.raises(click.UsageError, match="expects KEY=VALUE"):
        set_fields(["cap"], {})


@pytest.mark.parametrize("budget, org", [("b83 ", "s2"), ("B83", "S2"), ("b0083", "s2")])
def test_a_budget_and_organization_are_stored_in_one_spelling(tmp_path, budget, org):
    _, run_dir = hbench_run(tmp_path, "--budget", budget, "--org", org, "--requests", "4")
    manifest = json.loads((tmp_path / run_dir.rsplit("/", 1)[-1] / "manifest.json").read_text())
    assert (manifest["config"]["budget"], manifest["budget"]["label"]) == ("b83", "b83")
    assert (manifest["config"]["org"], manifest["org"]) == ("s2", "s2")
    assert "-s2-b83-" in run_dir


@pytest.mark.parametrize("first, again", [
    (["--org", "s2", "--budget", "b83"], ["--set", "org=S2", "--set", "budget= B083 "]),
    (["--org", "s2", "--budget", "b83"], ["--org", " S2", "--set", "budget=b0083,B83"]),
    (["--org", "s2", "--budget", "12GiB"], ["--set", "org=s2", "--set", "budget= 012.0 gib "]),
])
def test_a_sweep_typed_another_way_finds_its_cell_done(tmp_path, first, again):
    """The cell id hashes the canonical labels: the second spelling is the same
    cell, so the rerun skips it rather than running (and pairing) it twice."""
    common = ["--requests", "4", "--seeds", "1", "--out", tmp_path / "o"]
    assert invoke("sweep", *first, *common).exit_code == 0
    res = invoke("sweep", *again, *common)
    assert res.exit_code == 0, res.output
    assert "1 cells: 0 ran, 1 already done, 0 failed" in res.output
    assert len([p for p in (tmp_path / "o").iterdir() if p.is_dir()]) == 1
