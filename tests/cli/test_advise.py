"""`hbench advise` end to end on the simulator, on small grids: it answers in
sentences that name the arm, its capacity and its limit, says what to deploy,
writes its documents, reuses finished cells, bounds itself by a time budget,
prints a plan without running it, and refuses bad input in one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from analysis.capacity import per_seed_capacity
from hbench.cli import cli
from tests.support import REPO_ROOT

pytestmark = pytest.mark.slow

SMALL = ["--requests", "24", "--rates", "1,2", "--seeds", "1-2", "--orgs", "s2,d0"]


def advise(*args: str):
    return CliRunner().invoke(cli, ["advise", *args], catch_exceptions=False)


def cell_dirs(out):
    return sorted(p.name for p in out.iterdir() if p.is_dir())


def test_advise_answers_with_the_arm_its_limit_and_what_to_deploy(tmp_path):
    out = tmp_path / "adv"
    done = advise(*SMALL, "--budget", "b20", "--out", str(out))
    assert done.exit_code == 0, done.output
    doc = json.loads((out / "advise.json").read_text())
    best = doc["best"]
    # the answer is the arm with the most capacity, recomputed from its cells
    cells = [c for c in doc["cells"] if c["arm"] == best["arm"]]
    import pandas as pd

    caps = per_seed_capacity(pd.DataFrame(cells))
    assert best["capacity_req_s"] == pytest.approx(sum(caps.values()) / len(caps))
    assert all(a["capacity_req_s"] <= best["capacity_req_s"] for a in doc["arms"])
    text = done.output
    assert f"use {best['org'].upper()} with a running cap of 63" in text
    assert "What limits it" in text or "no limit was found" in text
    assert doc["limit"]["kind"] in ("cap", "memory", "token budget", "compute", "grid")
    assert "What to deploy:" in text and ("vLLM 0.32.0" in text and "SGLang 0.5.23" in text)
    assert "hbench probe --endpoint" in text
    # the grid is named with its source, not hidden (nor claimed for every model)
    assert "every arm's grid: S0/S1/S2 512-token pages; D0 16-token blocks, a checkpoint every " \
        "1792 tokens" in " ".join(text.split())
    assert "declared by preset falcon-h1-7b" in text and "every model" not in text
    for name in ("advise.json", "advise.md", "report.html"):
        assert (out / name).is_file()
    assert "<h2>Answer</h2>" in (out / "report.html").read_text()


def test_a_second_call_reuses_every_finished_cell(tmp_path):
    out = tmp_path / "adv"
    args = [*SMALL, "--budget", "b20", "--out", str(out)]
    assert advise(*args).exit_code == 0
    before = {d: (out / d / "manifest.json").stat().st_mtime_ns for d in cell_dirs(out)}
    again = advise(*args)
    assert again.exit_code == 0
    assert {d: (out / d / "manifest.json").stat().st_mtime_ns for d in cell_dirs(out)} == before


def test_a_spent_time_budget_answers_with_the_arms_that_ran(tmp_path):
    out = tmp_path / "adv"
    done = advise(*SMALL, "--budget", "b20", "--time-budget", "0.001s", "--out", str(out))
    assert done.exit_code == 0, done.output
    doc = json.loads((out / "advise.json").read_text())
    assert doc["arms_run"] == ["s2 cap 63"] and "time budget" in doc["stopped"]
    assert "The search stopped early" in done.output


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    out = tmp_path / "adv"
    done = advise(*SMALL, "--caps", "32,63", "--d0-attn-fractions", "0.5,0.25", "--out", str(out),
                  "--dry-run")
    assert done.exit_code == 0, done.output
    # s2 x 2 caps + d0 x 2 caps x 2 splits = 6 arms, 2 rates x 2 seeds each
    assert "6 arms x 2 rates x 2 seeds = 24 cells" in done.output
    lines = done.output.splitlines()
    assert lines[1:3] == ["  s2 cap 32", "  d0 cap 32 split 0.5"]   # every org first
    assert not out.exists()


def test_a_set_field_is_typed_and_reaches_every_run_and_the_flags_to_deploy(tmp_path):
    out = tmp_path / "adv"
    done = advise(*SMALL, "--budget", "b20", "--set", "headroom=0.1", "--out", str(out))
    assert done.exit_code == 0, done.output
    doc = json.loads((out / "advise.json").read_text())
    from harness.results import read_run

    assert {read_run(out / c["run_id"]).manifest["config"]["headroom"] for c in doc["cells"]} \
        == {0.1}
    assert doc["best"]["org"] in ("s2", "d0") and "--watermark 0.1" in done.output  # vLLM's line


def test_a_hand_written_hybrid_config_is_advised_too(tmp_path):
    out = tmp_path / "adv"
    config = REPO_ROOT / "tests/fixtures/configs/nemotron_h.json"
    done = advise("--config", str(config), "--budget", "4GiB", *SMALL, "--out", str(out))
    assert done.exit_code == 0, done.output
    assert "For nemotron_h.json on a100-pcie-40gb with 4GiB for state" in done.output


def test_level_organizations_are_tried_on_less_memory_to_say_what_would_change_that(tmp_path):
    out = tmp_path / "adv"
    done = advise("--gpu", "h100-sxm", "--budget", "55GiB", "--orgs", "s2,d0", "--requests", "24",
                  "--seeds", "1", "--rates", "1,2", "--out", str(out))
    assert done.exit_code == 0, done.output
    doc = json.loads((out / "advise.json").read_text())
    smaller = doc["smaller_budget"]
    assert smaller["share"] in (0.5, 0.25) and smaller["budget"].endswith("GiB")
    assert {a["org"] for a in smaller["arms"]} == {"s2", "d0"}
    from harness.results import read_run

    budgets = {read_run(p.parent).manifest["config"]["budget"]
               for p in out.glob("*/manifest.json")}
    assert smaller["budget"] in budgets and "55GiB" in budgets
    assert "What would change that" in done.output


def test_at_one_rate_the_arms_are_compared_there_with_their_searched_settings(tmp_path):
    out = tmp_path / "adv"
    done = advise("--requests", "24", "--seeds", "1-2", "--orgs", "s2,d0", "--budget", "b20",
                  "--at-rate", "3", "--headrooms", "0,0.19", "--ckpt-policies", "every,marconi",
                  "--out", str(out))
    assert done.exit_code == 0, done.output
    doc = json.loads((out / "advise.json").read_text())
    assert {c["rate"] for c in doc["cells"]} == {3.0}
    assert len(doc["arms"]) == 2 * 2 * 2 and len(doc["cells"]) == 2 * 2 * 2 * 2
    from harness.results import read_run

    configs = {(c["arm"], read_run(out / c["run_id"]).manifest["config"]["headroom"],
                read_run(out / c["run_id"]).manifest["config"]["ckpt_publish"])
               for c in doc["cells"]}
    assert {(h, p) for _, h, p in configs} == {(0.0, "every"), (0.19, "every"),
                                               (0.0, "marconi"), (0.19, "marconi")}
    best = doc["best"]
    assert doc["margin"]["metric"] in ("throughput_ledger_tok_s", "ttft_p99_s")
    assert f"at 3 req/s: use {best['org'].upper()} with a running cap of 63" in done.output
    assert "Compared on " in done.output and "paired seeds" in done.output
    page, md = (out / "report.html").read_text(), (out / "advise.md").read_text()
    assert "<h2>Each arm at 3 req/s</h2>" in page
    # the compared metric by its name and unit, never its column key
    words = {"throughput_ledger_tok_s": "throughput (output tokens/s, ledger timebase)",
             "ttft_p99_s": "TTFT p99 (s)"}[doc["margin"]["metric"]]
    assert f"<th>{words} (mean over seeds)</th>" in page
    assert "At 3 req/s:" in md and f"| arm | {words} |" in md
    assert "seeds holding the SLO" in md and doc["margin"]["metric"] not in md


@pytest.mark.parametrize("args, message", [
    (["--orgs", "s9"], "s9"),
    (["--caps", "0"], "--caps must all be >= 1"),
    (["--caps", "many"], "--caps takes whole numbers"),
    (["--d0-attn-fractions", "1.5"], "--d0-attn-fractions must all be in (0, 1)"),
    (["--time-budget", "soon"], "--time-budget 'soon'"),
    (["--slo", "ttft<=2s"], "ttft<=2s"),
    (["--budget", "b0"], "b0"),
    (["--set", "bogus=1"], "unknown grid key 'bogus'"),
    (["--at-rate", "0"], "--at-rate must be > 0"),
    (["--at-rate", "nan"], "--at-rate"),
    (["--headrooms", "0,1.5"], "--headrooms must all be in [0, 1)"),
    (["--ckpt-policies", "often"], "--ckpt-policies 'often'"),
    (["--headrooms", "0,0.1", "--set", "headroom=0.2"], "drop --set headroom"),
])
def test_bad_input_is_one_error_line_before_any_work(tmp_path, args, message):
    out = tmp_path / "adv"
    done = CliRunner().invoke(cli, ["advise", "--requests", "24", *args, "--out", str(out)])
    assert done.exit_code != 0
    lines = [ln for ln in done.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], lines
    assert not out.exists()
