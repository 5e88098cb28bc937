"""Hostile files and paths: inputs that are FIFOs (which would block a reader
forever), directories, missing, non-UTF-8, deeply nested or non-finite JSON,
malformed cost profiles and saved workloads; outputs that are empty, dangling
links, link loops, over-long names, directories where a file goes or files
where a directory goes; malformed endpoint URLs. Each is one ``Error:`` line,
exit 2, nothing written, and no wait."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.hostile import (
    deep_json,
    deep_object,
    in_a_scratch_directory,  # noqa: F401  (autouse fixture)
    make_results_tree,
    profile_text,
    refused,
)
from workloads.build import build_workload
from workloads.io import save_workload

SMALL = ["--requests", "8", "--rate", "4", "--seed", "3"]




@pytest.fixture(scope="module")
def results_tree(tmp_path_factory):
    return make_results_tree(tmp_path_factory.mktemp("results"))


@pytest.fixture
def hostile(tmp_path):
    """A folder of hostile input files, by kind."""
    d = tmp_path / "in"
    d.mkdir()
    os.mkfifo(d / "fifo.json")
    os.mkfifo(d / "fifo.toml")
    os.mkfifo(d / "fifo.parquet")
    os.mkfifo(d / "fifo")
    (d / "deep.json").write_text(deep_json())
    (d / "deep_obj.json").write_text(deep_object())
    (d / "latin1.json").write_bytes(b'{"a": "\xff\xfe"}')
    (d / "latin1.txt").write_bytes(b"12\n\xff13\n")
    (d / "nan.json").write_text('{"a": NaN}')
    (d / "empty.txt").write_text("")
    (d / "comments.txt").write_text("# nothing here\n\n")
    (d / "deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    (d / "dir").mkdir()
    return d


INPUTS = {
    # (command line with IN for the file, the file kinds it is handed)
    "run --gpu": (["run", *SMALL, "--out", "OUT", "--gpu", "IN"],
                  ["fifo.json", "deep.json", "latin1.json", "nan.json", "dir", "missing.json"]),
    "run --config": (["run", *SMALL, "--out", "OUT", "--config", "IN"],
                     ["fifo.json", "deep.json", "deep_obj.json", "latin1.json", "nan.json",
                      "missing.json"]),
    "run --workload": (["run", "--out", "OUT", "--workload", "IN"],
                       ["fifo.parquet", "deep.json", "dir", "missing.parquet"]),
    "run --dataset": (["run", *SMALL, "--out", "OUT", "--dataset", "IN"],
                      ["fifo.json", "deep.json", "latin1.json", "empty.txt"]),
    "sweep --grid": (["sweep", "--grid", "IN", "--dry-run", "--out", "OUT"],
                     ["fifo.toml", "latin1.txt", "deep.toml", "dir", "missing.toml"]),
    "sweep --set gpu": (["sweep", "--seeds", "1", "--dry-run", "--out", "OUT", "--set", "gpu=IN"],
                        ["fifo.json", "deep.json", "nan.json", "missing.json"]),
    "ledger --lengths-from": (["ledger", "--lengths-from", "IN"],
                              ["fifo", "deep.json", "latin1.txt", "empty.txt", "comments.txt",
                               "nan.json", "dir", "missing.txt"]),
    "ledger --config": (["ledger", "--config", "IN"], ["fifo.json", "deep.json", "latin1.json"]),
    "geometry --config": (["geometry", "--config", "IN"], ["fifo.json", "deep_obj.json"]),
    "budget --config": (["budget", "b83", "--config", "IN"], ["fifo.json", "deep.json"]),
    "workload build --dataset": (["workload", "build", "--requests", "8", "--dataset", "IN",
                                  "-o", "OUT/w.parquet"], ["fifo.json", "deep.json", "empty.txt"]),
    "workload build --tokenizer": (["workload", "build", "--requests", "8", "--tokenizer", "IN",
                                    "-o", "OUT/w.parquet"], ["fifo", "missing.json"]),
    "workload describe": (["workload", "describe", "IN"], ["fifo.parquet", "deep.json", "dir"]),
    "fidelity --profile": (["fidelity", "--engine", "torch", "--model", "IN", "--profile", "IN",
                            "--out", "OUT"], ["fifo.json"]),
}
INPUT_CASES = [(name, kind) for name, (_, kinds) in INPUTS.items() for kind in kinds]


@pytest.mark.slow
@pytest.mark.parametrize("name, kind", INPUT_CASES, ids=[f"{n}:{k}" for n, k in INPUT_CASES])
def test_a_hostile_input_file_is_refused(tmp_path, hostile, name, kind):
    args = [a.replace("IN", str(hostile / kind)).replace("OUT", str(tmp_path / "out"))
            for a in INPUTS[name][0]]
    refused(args, watch=tmp_path)


@pytest.mark.slow
def test_analyze_refuses_a_fifo_design_before_it_blocks(tmp_path, hostile, results_tree):
    refused(["analyze", results_tree, "--design", hostile / "fifo.toml", "--no-figures",
             "--out", tmp_path / "an"], "not a regular file", watch=tmp_path)


@pytest.mark.parametrize("kind", ["deep.toml", "latin1.txt", "dir"])
def test_analyze_refuses_a_hostile_design_file(tmp_path, hostile, results_tree, kind):
    refused(["analyze", results_tree, "--design", hostile / kind, "--no-figures",
             "--out", tmp_path / "an"], watch=tmp_path)


# ---------------------------------------------------------------- profiles

PROFILES = [
    ({"mem_bytes_s": "NaN"}, "not valid json"),
    ({"gemm_flops_s": "Infinity"}, "not valid json"),
    ({"attn_flops_s": "-Infinity"}, "not valid json"),
    ({"scan_flops_s": "1e400"}, "not valid json"),
    ({"mem_bytes_s": "1e-300"}, "must be in"),
    ({"state_bytes_s": "1e308"}, "must be in"),
    ({"gemm_flops_s": "0"}, "must be > 0"),
    ({"mem_bytes_s": "-5e9"}, "must be > 0"),
    ({"mem_bytes_s": '"fast"'}, "must be a number"),
    ({"mem_bytes_s": "true"}, "must be a number"),
    ({"mem_bytes_s": "null"}, "must be a number"),
    ({"mem_bytes_s": "[1]"}, "must be a number"),
    ({"step_overhead_s": "1e308"}, "must be in"),
    ({"request_overhead_s": "1e-300"}, "must be in"),
    ({"step_overhead_s": "-1"}, ">= 0"),
    ({"mem_bytes": "true"}, "mem_bytes"),
    ({"mem_bytes": "1.5"}, "mem_bytes"),
    ({"mem_bytes": "-1"}, "mem_bytes"),
    ({"mem_bytes": "99999999999999999999999"}, "mem_bytes"),
    ({"mem_bytes": "1e400"}, "not valid json"),
]


@pytest.mark.parametrize("changes, words", PROFILES, ids=lambda v: str(v)[:30])
@pytest.mark.parametrize("how", ["run", "run-oversubscribed", "sweep"])
def test_a_malformed_cost_profile_is_refused_before_any_simulation(tmp_path, changes, words, how):
    prof = tmp_path / "prof.json"
    prof.write_text(profile_text(**changes))
    out = tmp_path / "out"
    args = {"run": ["run", *SMALL, "--out", out, "--gpu", prof],
            "run-oversubscribed": ["run", *SMALL, "--out", out, "--gpu", prof,
                                   "--allow-oversubscribe"],
            "sweep": ["sweep", "--seeds", "1", "--requests", "8", "--out", out,
                      "--set", f"gpu={prof}"]}[how]
    line = refused(args, words, watch=tmp_path)
    assert "cost profile" in line and str(prof) in line


def test_the_valid_profile_runs(tmp_path):
    prof = tmp_path / "prof.json"
    prof.write_text(profile_text())
    from click.testing import CliRunner

    from hbench.cli import cli
    res = CliRunner().invoke(cli, ["run", *SMALL, "--out", str(tmp_path / "o"), "--gpu", str(prof),
                                   "--json"])
    assert res.exit_code == 0, res.output


# ------------------------------------------------------------ saved workloads

@pytest.fixture(scope="module")
def saved_table(tmp_path_factory):
    path = tmp_path_factory.mktemp("wl") / "good.parquet"
    save_workload(build_workload(requests=6, rate=4.0, seed=3, q=1.0), path)
    return pq.read_table(path)


def _column(table, name, array):
    return table.set_column(table.schema.get_field_index(name), name, array)


WORKLOAD_EDITS = {
    "schema-text": lambda t, md: (t, {**md, b"hbench.workload.schema": b"abc"}),
    "schema-fullwidth": lambda t, md: (t, {**md, b"hbench.workload.schema": "１".encode()}),
    "schema-huge": lambda t, md: (t, {**md, b"hbench.workload.schema": b"9" * 5000}),
    "meta-deep": lambda t, md: (t, {**md, b"hbench.workload.meta": deep_json().encode()}),
    "meta-latin1": lambda t, md: (t, {**md, b"hbench.workload.meta": b"\xff\xfe"}),
    "meta-nan": lambda t, md: (t, {**md, b"hbench.workload.meta": b'{"seed": NaN}'}),
    "output_len-strings": lambda t, md: (_column(t, "output_len", pa.array(
        [str(x) for x in t.column("output_len").to_pylist()])), md),
    "arrival-strings": lambda t, md: (_column(t, "arrival_s", pa.array(["x"] * t.num_rows)), md),
    "ids-strings": lambda t, md: (_column(t, "prompt_token_ids", pa.array(["x"] * t.num_rows)), md),
    "ids-floats": lambda t, md: (_column(t, "prompt_token_ids", pa.array(
        [[1.5]] * t.num_rows)), md),
    "text-ints": lambda t, md: (_column(t, "prompt_text", pa.array([1] * t.num_rows)), md),
    "request_id-floats": lambda t, md: (_column(t, "request_id", pa.array(
        [0.5] * t.num_rows)), md),
    "salt-ints": lambda t, md: (_column(t, "salt", pa.array([1] * t.num_rows)), md),
}


@pytest.mark.parametrize("edit", sorted(WORKLOAD_EDITS))
@pytest.mark.parametrize("command", ["run", "describe"])
def test_a_saved_workload_with_a_bad_schema_or_column_is_refused(tmp_path, saved_table, edit,
                                                                  command):
    table, md = WORKLOAD_EDITS[edit](saved_table, dict(saved_table.schema.metadata))
    path = tmp_path / "w.parquet"
    pq.write_table(table.replace_schema_metadata(md), path)
    args = (["run", "--out", tmp_path / "out", "--workload", path] if command == "run"
            else ["workload", "describe", path])
    assert str(path) in refused(args, watch=tmp_path)


@pytest.mark.parametrize("cut", [0, 8, 500])
def test_a_truncated_workload_file_is_refused(tmp_path, saved_table, cut):
    path = tmp_path / "w.parquet"
    pq.write_table(saved_table, path)
    path.write_bytes(path.read_bytes()[:cut])
    refused(["run", "--out", tmp_path / "out", "--workload", path], str(path), watch=tmp_path)


# ------------------------------------------------------------ output paths

OUT_COMMANDS = {
    "run": (["run", *SMALL, "--out"], "dir"),
    "sweep": (["sweep", "--seeds", "1", "--requests", "8", "--out"], "dir"),
    "sweep-dry": (["sweep", "--seeds", "1", "--requests", "8", "--dry-run", "--out"], "dir"),
    "workload-build": (["workload", "build", "--requests", "8", "-o"], "file"),
    "tiny-model": (["tiny-model", "-o"], "dir"),
    "report": (["report", "RESULTS", "-o"], "file"),
    "analyze": (["analyze", "RESULTS", "--no-figures", "--out"], "dir"),
    "regress": (["regress", "--baseline", "RESULTS", "--candidate", "RESULTS", "--report"], "file"),
    "capacity": (["capacity", "--rates", "1", "--seeds", "1", "--out"], "dir"),
    "reproduce": (["reproduce", "q4", "--quick", "--out"], "dir"),
    "calibrate": (["calibrate", "--engine", "torch", "--model", "RESULTS", "-o"], "file"),
}
TARGETS = ["empty", "dangling", "under-dangling", "loop", "under-loop", "long-name",
           "long-name-below", "fifo", "wrong-kind"]
OUT_CASES = [(c, t) for c in OUT_COMMANDS for t in TARGETS
             if not (t == "empty" and c in ("regress",))]


def _target(tmp_path, kind: str, wants: str) -> str:
    links = tmp_path / "links"
    links.mkdir(exist_ok=True)
    if kind == "empty":
        return ""
    if kind in ("dangling", "under-dangling"):
        os.symlink(tmp_path / "nowhere", links / "dangling")
        return str(links / "dangling") + ("/sub/x" if kind == "under-dangling" else "")
    if kind in ("loop", "under-loop"):
        os.symlink(links / "loop", links / "loop")
        return str(links / "loop") + ("/sub" if kind == "under-loop" else "")
    if kind == "long-name":
        return str(tmp_path / ("n" * 300))
    if kind == "long-name-below":
        return str(tmp_path / "a" / ("n" * 300) / "b")
    if kind == "fifo":
        os.mkfifo(links / "fifo")
        return str(links / "fifo")
    # a directory where a file goes, a file where a directory goes
    if wants == "file":
        (links / "adir").mkdir()
        return str(links / "adir")
    (links / "afile").write_text("keep\n")
    return str(links / "afile")


@pytest.mark.parametrize("command, kind", OUT_CASES, ids=[f"{c}:{k}" for c, k in OUT_CASES])
def test_a_hostile_output_path_is_refused_at_start(tmp_path, results_tree, command, kind):
    args, wants = OUT_COMMANDS[command]
    target = _target(tmp_path, kind, wants)
    cwd_before = sorted(os.listdir(os.getcwd()))
    refused([a.replace("RESULTS", str(results_tree)) for a in args] + [target], watch=tmp_path)
    assert sorted(os.listdir(os.getcwd())) == cwd_before


# ------------------------------------------------------------------- URLs

URLS = ["http://[::1", "http://[::1:8000", "http://", "ftp://host:8000", "http://host:99999",
        "http://host:x", "http://host:0", "http://hö st:80", "http://h\u00e9:80",
        "http://" + "a" * 5000, "http://host:80\n"]


@pytest.mark.parametrize("url", URLS, ids=lambda v: repr(v)[:24])
@pytest.mark.parametrize("command", ["run", "verify"])
def test_a_malformed_endpoint_is_one_line(tmp_path, url, command):
    args = (["run", *SMALL, "--engine", "vllm", "--org", "s0", "--out", tmp_path / "o",
             "--endpoint", url] if command == "run" else ["verify", "--endpoint", url])
    refused(args, "endpoint", watch=tmp_path)
