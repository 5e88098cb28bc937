"""`hbench run` end to end through the CLI, on small workloads."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.results import list_runs, read_run
from hbench.cli import cli
from tests.support.cli import hbench_run, invoke

SMALL = ["--requests", "16", "--rate", "4", "--seed", "3"]


def run_cli(tmp_path, *args):
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--json", *args])
    return res


def only_run(root):
    runs = list_runs(root)
    assert len(runs) == 1, runs
    return read_run(runs[0])


@pytest.mark.parametrize("org", ["s0", "s1", "s2", "d0"])
def test_every_organization_serves_every_request(tmp_path, org):
    res = run_cli(tmp_path, "--org", org, "--budget", "b83", *SMALL)
    assert res.exit_code == 0, res.output
    data = only_run(tmp_path)
    s, m = data["summary"], data["manifest"]
    assert s["finished"] == 16 and s["failed"] == 0 and s["cancelled"] == 0
    assert s["throughput_ledger_tok_s"] > 0
    assert s["throughput_span_tok_s"] >= s["throughput_ledger_tok_s"]
    assert s["ttft_p50_s"] > 0 and s["itl_p50_s"] > 0
    # the manifest makes the run traceable and rerunnable
    assert m["config"]["org"] == org and m["config"]["seed"] == 3
    assert m["engine"] == "sim" and m["engine_version"].startswith("sim-")
    assert m["budget"]["label"] == "b83" and all(p["pages"] > 0 for p in m["budget"]["pools"])
    assert len(m["workload_hash"]) == 64 and m["git_commit"]
    assert "numpy" in m["packages"]
    steps = data["steps"]
    assert {"time_s", "running", "waiting", "batch_tokens", "mem_attention_bytes",
            "blocks_attention_referenced", "blocks_ssm_cached", "blocks_conv_referenced",
            "weights_s", "bound"} <= set(steps.columns)
    # printed JSON agrees with the file
    printed = json.loads(res.output[res.output.index("{"):])
    assert printed["finished"] == 16


def test_token_conservation(tmp_path):
    assert run_cli(tmp_path, "--org", "s2", *SMALL).exit_code == 0
    data = only_run(tmp_path)
    req = data["requests"]
    assert (req["output_tokens"] == req["target_output_tokens"]).all()
    assert data["summary"]["output_tokens"] == req["output_tokens"].sum()
    steps = data["steps"]
    # tokens emitted per step add up: every request's first token ends a prefill step
    assert steps["decode_requests"].sum() + len(req) == req["output_tokens"].sum()


def test_same_seed_gives_identical_results(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli(a, "--org", "d0", *SMALL).exit_code == 0
    assert run_cli(b, "--org", "d0", *SMALL).exit_code == 0
    ra, rb = only_run(a), only_run(b)
    assert ra["summary"] == rb["summary"]
    pd.testing.assert_frame_equal(ra["requests"], rb["requests"])
    pd.testing.assert_frame_equal(ra["steps"], rb["steps"])
    assert ra["manifest"]["workload_hash"] == rb["manifest"]["workload_hash"]


@pytest.mark.slow
def test_no_share_control_does_identical_initial_work(tmp_path):
    """q = 0 with a roomy budget: no preemption, so every organization computes
    exactly the same prompt tokens at first admission (DESIGN.md section 8).
    b400 plus the weights exceeds the simulated 40 GiB, which this test of
    token accounting allows."""
    work = {}
    for org in ("s0", "s1", "s2", "d0"):
        out = tmp_path / org
        res = run_cli(out, "--org", org, "--budget", "b400", "--q", "0", "--allow-oversubscribe", *SMALL)
        assert res.exit_code == 0, res.output
        s = only_run(out)["summary"]
        assert s["preemptions"] == 0
        work[org] = s["initial_input_tokens"]
    assert len(set(work.values())) == 1, work


@pytest.mark.parametrize("args, needle", [
    (["--org", "s9"], "--org"),
    (["--rate", "-1"], "--rate"),
    (["--headroom", "1.5"], "--headroom"),
    (["--requests", "0"], "--requests"),
    (["--q", "2"], "--q"),
    (["--budget", "bogus"], "budget"),
    (["--budget", "b1", "--org", "s0"], "budget"),
    (["--budget", "b4", "--org", "s1"], "longest request"),
    (["--budget", "b2", "--org", "d0", "--d0-attn-fraction", "0.9"], "d0"),
    (["--gpu", "tpu-v9"], "hardware"),
    (["--model", "no-such-model"], "model"),
])
def test_bad_input_is_one_line_error(tmp_path, args, needle):
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), *SMALL, *args])
    assert res.exit_code != 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.output
    assert needle.lower() in lines[0].lower()
    assert "Traceback" not in res.output
    assert not list_runs(tmp_path)


@pytest.mark.slow
def test_warmup_requests_are_served_but_excluded_and_recorded(tmp_path):
    res = run_cli(tmp_path, "--org", "s1", "--warmup", "4", "--debug-invariants", *SMALL)
    assert res.exit_code == 0, res.output
    data = only_run(tmp_path)
    req = data["requests"]
    assert len(req) == 20 and req["warmup"].sum() == 4
    assert (req["status"] == "finished").all()
    s = data["summary"]
    assert s["requests"] == 16 and s["finished"] == 16
    assert s["output_tokens"] == req.loc[~req["warmup"], "output_tokens"].sum()
    assert data["manifest"]["warmup_requests"] == 4
    assert data["manifest"]["cache_state"] == "cold"


def test_run_serves_a_saved_workload(tmp_path):
    wl = tmp_path / "wl.parquet"
    res = CliRunner().invoke(cli, ["workload", "build", "--q", "1", "--rate", "5", "--requests", "10",
                                   "--seed", "7", "-o", str(wl)])
    assert res.exit_code == 0, res.output
    from workloads.io import load_workload

    expected_hash = load_workload(wl).content_hash
    out = tmp_path / "runs"
    res = run_cli(out, "--org", "s2", "--workload", str(wl))
    assert res.exit_code == 0, res.output
    data = only_run(out)
    assert data["manifest"]["workload_hash"] == expected_hash
    assert data["summary"]["finished"] == 10
    missing = CliRunner().invoke(cli, ["run", "--out", str(out), "--workload", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not found" in missing.output


def test_the_same_run_twice_in_one_second_gets_a_second_folder(tmp_path, monkeypatch):
    """Run ids are second-resolution: repeating the identical run within a
    second must not throw the finished run away with 'already exists'."""
    from datetime import UTC, datetime

    import hbench.runner
    from harness.results import free_run_id, is_done
    from harness.run_address import new_run_id

    monkeypatch.setattr(hbench.runner, "new_run_id", lambda config, wl_hash: new_run_id(
        config, wl_hash, now=datetime(2026, 1, 1, tzinfo=UTC)))
    args = ["run", "--org", "s2", "--budget", "b83", "--requests", "20", "--seed", "1",
            "--out", str(tmp_path)]
    for _ in range(2):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, res.output
    same = min(p.name for p in tmp_path.iterdir())
    assert same.startswith("20260101T000000Z-sim-s2-b83-s1-")
    assert sorted(p.name for p in tmp_path.iterdir()) == [same, f"{same}-2"]
    assert all(is_done(p) for p in tmp_path.iterdir())
    (tmp_path / f".tmp-{same}-3-4242").mkdir()    # a writer of -3 at work
    assert free_run_id(tmp_path, same) == f"{same}-4"
    assert free_run_id(tmp_path, "other") == "other"


def test_an_organization_and_a_budget_in_capitals_are_the_same_run(tmp_path):
    """--org S2 --budget B083 is --org s2 --budget b83: the same label, the same
    configuration, the same workload, in the run's directory name too."""
    doc, run_dir = hbench_run(tmp_path / "caps", "--org", "S2", "--budget", "B083",
                              "--requests", "10", "--seed", "3")
    same, same_dir = hbench_run(tmp_path / "lower", "--org", "s2", "--budget", "b83",
                                "--requests", "10", "--seed", "3")
    assert "-s2-b83-" in Path(run_dir).name
    manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    assert (manifest["org"], manifest["config"]["budget"]) == ("s2", "b83")
    assert Path(run_dir).name.split("-", 1)[1] == Path(same_dir).name.split("-", 1)[1]
    doc.pop("run_dir"), same.pop("run_dir")
    assert doc == same                  # the same requests served the same way


def test_a_sweep_in_capitals_makes_the_cells_of_one_in_lower_case(tmp_path):
    for name, orgs, budget in (("caps", "S2,D0", " B83"), ("lower", "s2,d0", "b83")):
        res = invoke("sweep", "--org", orgs, "--budget", budget, "--requests", "10",
                     "--seeds", "1", "--out", tmp_path / name)
        assert res.exit_code == 0, res.output
    cells = [sorted(p.name for p in (tmp_path / name).iterdir() if p.is_dir())
             for name in ("caps", "lower")]
    assert cells[0] == cells[1] and len(cells[0]) == 2
