"""The grid flags (`hbench.commands.grid_flags`): each run's grid is the
model's own, chosen or overridden on the command line, said in the run's
title and recorded in its manifest; bad values are one Error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results import read_run
from tests.support import FIXTURES
from tests.support.cli import hbench_run, invoke, one_error_line

FIX = FIXTURES / "configs"
SMALL = ["--requests", "6", "--rate", "4", "--seed", "1", "--mean-input", "1200"]


def _grid(run_dir) -> dict:
    return read_run(Path(run_dir)).manifest["grid"]


def test_a_default_run_records_the_studys_declared_grid_and_hashes_as_before(tmp_path):
    _, run_dir = hbench_run(tmp_path, "--org", "d0", *SMALL)
    manifest = read_run(Path(run_dir)).manifest
    assert manifest["grid"] == {
        "attn_block_tokens": 16, "grid_tokens": 1792, "paging": "study", "grid_from": "declared",
        "shared_block_tokens": 512, "dual_block_tokens": 16, "dual_grid_tokens": 1792,
        "source": "declared by preset falcon-h1-7b", "overridden": []}
    # the grid fields enter the recorded config only when set
    assert not {"grid_from", "shared_block_tokens", "dual_block_tokens",
                "dual_grid_tokens"} & set(manifest["config"])


@pytest.mark.parametrize("config, org, block, grid", [
    # the rule's values for the hand-written configs (tests/unit/harness/test_layout_grid.py)
    ("nemotron_h.json", "s1", 1024, 1024),
    ("nemotron_h.json", "d0", 16, 3328),
    ("jamba.json", "s2", 128, 128),
])
def test_a_hand_written_config_gets_its_own_grid(tmp_path, config, org, block, grid):
    res = invoke("run", "--out", tmp_path, "--config", FIX / config, "--org", org,
                 "--budget", "8GiB", "--gpu", "h200", *SMALL)   # h200: Jamba's 96 GiB of weights
    assert res.exit_code == 0, res.output
    words = (f"{block}-token pages, a checkpoint every page" if block == grid
             else f"{block}-token blocks, a checkpoint every {grid} tokens")
    assert f"grid: {words} (geometry rule)" in " ".join(res.output.split())   # the run's title
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    rec = _grid(run_dir)
    assert (rec["attn_block_tokens"], rec["grid_tokens"], rec["source"]) == (block, grid, "geometry rule")
    assert (rec["attn_block_tokens"], rec["grid_tokens"]) not in ((512, 512), (16, 1792))


def test_a_config_json_with_hbench_grid_runs_on_it(tmp_path):
    cfg = json.loads((FIX / "jamba.json").read_text()) | {
        "hbench_grid": {"shared_block_tokens": 256, "dual_block_tokens": 32, "dual_grid_tokens": 1024}}
    path = tmp_path / "jamba-grid.json"
    path.write_text(json.dumps(cfg))
    _, run_dir = hbench_run(tmp_path / "out", "--config", path, "--org", "d0", "--budget", "8GiB",
                            "--gpu", "h200", *SMALL)
    rec = _grid(run_dir)
    assert (rec["attn_block_tokens"], rec["grid_tokens"]) == (32, 1024)
    assert rec["source"] == f"declared in {path} (hbench_grid)"


def test_grid_from_and_overrides_are_recorded(tmp_path):
    _, run_dir = hbench_run(tmp_path, "--org", "s2", "--grid-from", "vllm", *SMALL)
    assert (_grid(run_dir)["attn_block_tokens"], _grid(run_dir)["source"]) == (1568, "vLLM's block rule")
    assert read_run(Path(run_dir)).manifest["config"]["grid_from"] == "vllm"
    _, run_dir = hbench_run(tmp_path, "--org", "d0", "--grid-from", "sglang",
                            "--dual-grid-tokens", "512", *SMALL)
    rec = _grid(run_dir)
    assert (rec["attn_block_tokens"], rec["grid_tokens"]) == (16, 512)
    assert rec["overridden"] == ["--dual-grid-tokens"]
    assert read_run(Path(run_dir)).manifest["config"]["dual_grid_tokens"] == 512


@pytest.mark.parametrize("args, needle", [
    (["--shared-block-tokens", "0"], "--shared-block-tokens"),
    (["--shared-block-tokens", "-512"], "--shared-block-tokens"),
    (["--shared-block-tokens", "abc"], "--shared-block-tokens"),
    (["--shared-block-tokens", "1e3"], "--shared-block-tokens"),
    (["--shared-block-tokens", "99999999999999999999999"], "--shared-block-tokens"),
    (["--shared-block-tokens", "2097152"], "--shared-block-tokens"),
    (["--org", "d0", "--dual-grid-tokens", "1000"], "multiple of dual_block_tokens 16"),
    (["--org", "d0", "--dual-block-tokens", "32", "--dual-grid-tokens", "48"],
     "--dual-grid-tokens 48 must be a multiple of --dual-block-tokens 32"),
    (["--grid-from", "nope"], "--grid-from"),
    (["--org", "d0", "--shared-block-tokens", "256"], "--shared-block-tokens"),
    (["--org", "s1", "--dual-grid-tokens", "256"], "--dual-grid-tokens"),
    (["--org", "s1", "--paging", "vllm", "--grid-from", "rule"], "--paging vllm"),
    (["--org", "s2", "--token-budget", "1024", "--shared-block-tokens", "2048"], "grid of 2048"),
])
def test_bad_grid_values_are_one_error_line(tmp_path, args, needle):
    res = invoke("run", "--out", tmp_path, *SMALL, *args)
    one_error_line(res, needle, code=None)
    assert not any(tmp_path.iterdir())


def test_a_server_engine_refuses_the_grid_flags(tmp_path):
    res = invoke("run", "--out", tmp_path, "--engine", "sglang", "--org", "d0",
                 "--endpoint", "http://127.0.0.1:9", "--grid-from", "rule", *SMALL)
    one_error_line(res, "--grid-from", "real engine", code=None)


def test_capacity_takes_a_config_and_the_grid_flags(tmp_path):
    out = tmp_path / "cap"
    res = invoke("capacity", "--config", FIX / "nemotron_h.json", "--org", "s1", "--budget", "8GiB",
                 "--rates", "1", "--seeds", "1", "--requests", "4", "--grid-from", "vllm",
                 "--set", "mean_input=1200", "--out", out, "--json")
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    rec = _grid(run_dir)
    assert (rec["attn_block_tokens"], rec["source"]) == (3168, "vLLM's block rule")
    one_error_line(invoke("capacity", "--model", "falcon-h1-7b", "--config", FIX / "jamba.json",
                          "--out", tmp_path / "x"), "not both", code=None)
    one_error_line(invoke("capacity", "--dual-block-tokens", "0", "--out", tmp_path / "x"),
                   "--dual-block-tokens", code=None)


def test_sweep_takes_grid_axes(tmp_path):
    res = invoke("sweep", "--org", "s1", "--shared-block-tokens", "256,512", "--requests", "4",
                 "--out", tmp_path / "sw", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "2 cells, 0 done, 2 to run" in res.output
    one_error_line(invoke("sweep", "--org", "s1", "--grid-from", "rule,bogus", "--out",
                          tmp_path / "sw2", "--dry-run"), "--grid-from", code=None)


def test_advise_states_the_grid_and_where_it_came_from():
    from types import SimpleNamespace

    from hbench.advise import Arm, Search
    from hbench.commands.advise import _grid_words

    def advised(base, org):
        """An advise result whose best arm is ``org`` at cap 63, as its runs had it."""
        arm = Arm(org, 63, 0.5 if org == "d0" else None)
        search = Search(orgs=(org,), caps=(63,), fractions=(0.5,), rates=(1.0,), seeds=(1,),
                        limits=(), base=base)
        return SimpleNamespace(decision=SimpleNamespace(best={"org": org, "arm": arm.label}),
                               search=search, arms_run=[arm])

    base = {"model": "falcon-h1-7b", "config_path": str(FIX / "nemotron_h.json"), "gpu": "a100-pcie-40gb",
            "budget": "8GiB", "workload_kind": "sharegpt", "requests": 10}
    words = _grid_words(advised(base, "s1"))
    assert words.startswith("Pages: S1 ran with 1024-token pages, a checkpoint every page "
                            "(geometry rule); every arm's grid: S0/S1/S2 1024-token pages; "
                            "D0 16-token blocks, a checkpoint every 3328 tokens."), words
    assert "Falcon-H1-7B" not in words and "every model" not in words
    sglang = advised({**base, "config_path": None, "grid_from": "sglang"}, "d0")
    assert "D0 ran with 16-token blocks, a checkpoint every 256 tokens (SGLang's track interval)" \
        in _grid_words(sglang)


def test_advise_refuses_bad_grid_values(tmp_path):
    one_error_line(invoke("advise", "--shared-block-tokens", "0", "--out", tmp_path / "a"),
                   "--shared-block-tokens", code=None)
    one_error_line(invoke("advise", "--orgs", "s1,s2", "--dual-grid-tokens", "256", "--dry-run",
                          "--out", tmp_path / "a"), "--dual-grid-tokens", code=None)
