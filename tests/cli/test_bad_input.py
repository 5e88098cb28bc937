"""Bad input through the CLI: one ``Error:`` line, a non-zero exit, nothing written.

Each case would otherwise crash, run away or run something meaningless:
absurd sizes grow memory until the kernel kills the process, a token budget
below the organization's grid stalls the scheduler, an unwritable --out is
found only after simulating, an oversubscribed GPU runs happily.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from common.errors import HbenchError
from harness.config import (
    MAX_RUN_MEMORY_BYTES,
    RUN_BYTES_PER_MADE_REQUEST,
    RUN_BYTES_PER_PROMPT_TOKEN,
    RUN_BYTES_PER_REQUEST,
    RunConfig,
)
from harness.model_configs import geometry_for_run
from harness.orgs import layout_for
from harness.results import list_runs, read_run
from harness.run_setup import check_memory
from hbench.cli import cli
from tests.support.cli import one_error_line, overridden
from workloads.bounds import MAX_REQUESTS
from workloads.build import build_workload
from workloads.io import save_workload, stored_hashes
from workloads.request_seq import MADE_AT_ONCE

SMALL = ["--requests", "12", "--rate", "4", "--seed", "3"]


def grid(org: str) -> int:
    return layout_for(org, geometry_for_run(RunConfig(org=org))).grid_tokens


RUN_CASES = [
    (["--requests", "99999999999999"], f"<= {MAX_REQUESTS:,}"),
    (["--requests", "100000", "--workload-kind", "multiturn"], "GiB of memory"),
    (["--budget", "500TiB", "--allow-oversubscribe"], "GiB of memory"),
    (["--duration", "inf"], "--duration must be a finite number"),
    (["--duration", "nan"], "--duration must be a finite number"),
    (["--duration", "1e12"], "--duration must be <="),
    (["--duration", "100000", "--rate", "1000"], "--duration x --rate"),
    (["--rate", "inf"], "--rate must be a finite number"),
    (["--rate", "nan"], "--rate must be a finite number"),
    (["--headroom", "nan"], "--headroom must be a finite number"),
    (["--q", "nan"], "--q must be a finite number"),
    (["--model", "falcon-h1-34b", "--budget", "b108"], "--allow-oversubscribe"),
    (["--model", "falcon-h1-3b", "--config", "tests/fixtures/configs/bamba.json"], "not both"),
]


@pytest.mark.parametrize("args, needle", RUN_CASES)
def test_run_refuses_bad_input_in_one_line(tmp_path, args, needle):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["run", "--out", str(out), *overridden(SMALL, args)])
    one_error_line(res, needle, code=None)
    assert not out.exists()


@pytest.mark.parametrize("org", ["s0", "s1", "s2", "d0"])
def test_token_budget_below_the_grid_names_the_minimum(tmp_path, org):
    g = grid(org)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["run", "--out", str(out), "--org", org,
                                   "--token-budget", str(g - 1), *SMALL])
    line = one_error_line(res, f"minimum for {org} is {g}", code=None)
    assert str(g - 1) in line
    assert not out.exists()


def test_the_grids_are_those_of_the_layouts():
    # s0/s1/s2 schedule on 512-token blocks; d0 on its 1792-token checkpoint grid.
    assert [grid(o) for o in ("s0", "s1", "s2", "d0")] == [512, 512, 512, 1792]


def test_the_memory_estimate_refuses_above_the_documented_limit():
    """The most requests one run may ask for fit when the workload is made as
    it is served; a workload that holds its prompts (multi-turn) that large
    does not."""
    cfg = RunConfig(requests=1_000_000)
    assert cfg.made_on_read
    assert cfg.estimated_run_bytes == 1_000_000 * RUN_BYTES_PER_MADE_REQUEST < MAX_RUN_MEMORY_BYTES
    held = RunConfig(requests=100_000, workload_kind="multiturn")   # 8 turns a session
    assert held.estimated_run_bytes > MAX_RUN_MEMORY_BYTES
    with pytest.raises(HbenchError, match="GiB of memory"):
        check_memory(held.expected_requests, held.mean_input)
    assert RunConfig(requests=240).estimated_run_bytes < MAX_RUN_MEMORY_BYTES / 100


def test_a_workload_made_on_read_is_estimated_without_its_prompts():
    """A derived workload past `MADE_AT_ONCE` requests holds no prompt (it is
    made as served): its estimate is per request only; one made at once, a
    multi-turn one and a saved one hold their prompts."""
    assert not RunConfig(requests=MADE_AT_ONCE).made_on_read
    assert RunConfig(requests=MADE_AT_ONCE + 1).made_on_read
    assert not RunConfig(requests=40_000, workload_kind="multiturn").made_on_read
    assert not RunConfig(requests=40_000, workload_path="w.parquet").made_on_read
    assert RunConfig(requests=40_000, mean_input=6000).estimated_run_bytes == \
        RunConfig(requests=40_000, mean_input=1000).estimated_run_bytes
    held = RunConfig(requests=MADE_AT_ONCE, mean_input=6000).estimated_run_bytes
    assert held == MADE_AT_ONCE * (RUN_BYTES_PER_REQUEST + RUN_BYTES_PER_PROMPT_TOKEN * 6000)


def test_oversubscription_is_allowed_when_asked(tmp_path):
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--model", "falcon-h1-34b",
                                   "--budget", "b108", "--allow-oversubscribe", "--json", *SMALL])
    assert res.exit_code == 0, res.output
    assert len(list_runs(tmp_path)) == 1


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "plain.txt"
    f.write_text("not a directory\n")
    return f


OUT_COMMANDS = {
    "run": ["run", *SMALL, "--out"],
    "sweep": ["sweep", "--org", "s2", "--seeds", "1", "--requests", "12", "--out"],
    "reproduce": ["reproduce", "q4", "--quick", "--out"],
    "workload-build": ["workload", "build", "--requests", "12", "-o"],
    "tiny-model": ["tiny-model", "-o"],
}
# A directory output may not be a file; a file output (workload build) may
# replace a file but not be a directory. Neither may lie under a file.
BAD_TARGETS = [(name, kind) for name in OUT_COMMANDS
               for kind in (("dir", "under-file") if name == "workload-build" else ("file", "under-file"))]


@pytest.mark.parametrize("name, kind", BAD_TARGETS)
def test_out_is_checked_at_start(tmp_path, a_file, name, kind):
    target = {"file": a_file, "under-file": a_file / "sub" / "x", "dir": tmp_path}[kind]
    before = sorted(tmp_path.rglob("*"))
    res = CliRunner().invoke(cli, [*OUT_COMMANDS[name], str(target)])
    assert res.exit_code != 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.output
    assert a_file.read_text() == "not a directory\n"
    assert sorted(tmp_path.rglob("*")) == before


def test_analyze_checks_its_out_before_loading(tmp_path, a_file):
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path), "--out", str(a_file)])
    one_error_line(res, "not a directory", code=None)


@pytest.mark.parametrize("args, needle", [
    (["--set", "token_budget=100"], "minimum for s2 is 512"),
    (["--requests", "99999999"], f"<= {MAX_REQUESTS:,}"),
    (["--set", "duration_s=inf"], "finite"),
    (["--model", "falcon-h1-3b", "--set", "config_path=tests/fixtures/configs/bamba.json"], "not both"),
    (["--model", "falcon-h1-34b", "--budget", "b108"], "--allow-oversubscribe"),
])
def test_sweep_refuses_bad_cells_before_any_work(tmp_path, args, needle):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["sweep", "--org", "s2", "--seeds", "1", "--out", str(out), *args])
    one_error_line(res, needle, code=None)
    assert not out.exists()


# ------------------------------------------------------------ workload files

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("wl") / "w.parquet"
    save_workload(build_workload(seed=5, q=0.5, rate=4.0, requests=12), path)
    return path


def _rewrite(src, dst, *, column=None, values=None, keep_hash=False):
    """A copy of ``src`` with one column replaced; without ``keep_hash`` the
    stored hashes are recomputed for the edited rows (`stored_hashes`), so
    the file passes its integrity check and the row checks themselves are
    tested; with it the original hashes stay and no longer match."""
    table = pq.read_table(src)
    if column is not None:
        typ = table.schema.field(column).type
        table = table.set_column(table.column_names.index(column), column, pa.array(values, typ))
    table = table.replace_schema_metadata(dict(table.schema.metadata))
    if not keep_hash:
        table = table.replace_schema_metadata({**table.schema.metadata, **stored_hashes(table)})
    pq.write_table(table, dst)
    return dst


def _column(path, name):
    return pq.read_table(path).column(name).to_pylist()


@pytest.mark.parametrize("column, edit, needle", [
    ("arrival_s", lambda v: [float("nan"), *v[1:]], "arrival time nan"),
    ("arrival_s", lambda v: [-1.0, *v[1:]], "arrival time -1.0"),
    ("prompt_token_ids", lambda v: [[], *v[1:]], "empty prompt"),
    ("output_len", lambda v: [v[0], 0, *v[2:]], "output length 0"),
    ("output_len", lambda v: [v[0], -3, *v[2:]], "output length -3"),
    ("output_len", lambda v: [v[0], 9000, *v[2:]], "max model length 8192"),
])
def test_bad_workload_files_are_refused_on_load(tmp_path, saved, column, edit, needle):
    bad = _rewrite(saved, tmp_path / "bad.parquet", column=column, values=edit(_column(saved, column)))
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["run", "--out", str(out), "--workload", str(bad)])
    line = one_error_line(res, needle, code=None)
    assert str(bad) in line
    assert not out.exists()
    described = CliRunner().invoke(cli, ["workload", "describe", str(bad)])
    one_error_line(described, needle)


def test_an_edited_workload_fails_its_content_hash(tmp_path, saved):
    lens = _column(saved, "output_len")
    bad = _rewrite(saved, tmp_path / "edited.parquet", column="output_len",
                   values=[lens[0] + 1, *lens[1:]], keep_hash=True)
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path / "out"), "--workload", str(bad)])
    one_error_line(res, "content hash mismatch", code=None)


def test_a_workload_run_records_the_workloads_own_recipe(tmp_path, saved):
    """analyze pairs on the manifest's seed, q, rate, requests: for a saved
    workload those are the workload's (a flag that would set one is refused)."""
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--json", "--workload", str(saved),
                                   "--warmup", "2"])
    assert res.exit_code == 0, res.output
    cfg = read_run(list_runs(tmp_path)[0])["manifest"]["config"]
    meta = json.loads(pq.read_schema(saved).metadata[b"hbench.workload.meta"])
    assert (cfg["seed"], cfg["q"], cfg["rate"], cfg["requests"]) == (5, 0.5, 4.0, 10)
    assert cfg["mean_input"] == meta["mean_input_target"] and cfg["arrival"] == meta["arrival"]
    assert cfg["warmup_requests"] == 2


def test_reproduce_on_vllm_without_its_venv_is_refused_before_any_cell(tmp_path, monkeypatch):
    """`reproduce --engine vllm` checks every cell against vLLM's scheduler in
    process first: without the vLLM venv nothing runs and nothing is written."""
    monkeypatch.delenv("HBENCH_VLLM_PYTHON", raising=False)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["reproduce", "q4", "--quick", "--engine", "vllm",
                                   "--out", str(out)])
    one_error_line(res, "design q4 on --engine vllm", "vLLM is not installed")
    assert not any(out.rglob("*"))


def test_a_multi_turn_workload_at_a_short_model_length_builds(tmp_path):
    """--mean-input is the ShareGPT kind's alone, so its default (3,332) is not
    held against a 2,048-token model length when the workload is multi-turn;
    the ShareGPT kind still refuses it there."""
    out = tmp_path / "mt.parquet"
    common = ["workload", "build", "--requests", "3", "--max-model-len", "2048", "--max-output",
              "16"]
    res = CliRunner().invoke(cli, [*common, "--workload-kind", "multiturn", "--max-turns", "2",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.is_file()
    refused = CliRunner().invoke(cli, [*common, "-o", str(tmp_path / "s.parquet")])
    one_error_line(refused, "--mean-input must be in")
