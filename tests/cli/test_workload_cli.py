"""`hbench workload build|describe` end to end through the click group."""

import json

import pytest
from click.testing import CliRunner

from hbench.cli import cli
from workloads.io import load_workload


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def dataset(tmp_path):
    """40 conversations of numbered words; each opening is unique."""
    records = []
    for i in range(40):
        body = " ".join(f"w{(i * 7 + k) % 97}x" for k in range(30 + i % 9))
        records.append({"id": str(i), "conversations": [
            {"from": "human", "value": f"Question {i}: {body[: 40 + 3 * i]}"},
            {"from": "gpt", "value": body * (1 + i % 3)}]})
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(records))
    return path


BUILD = ["workload", "build", "--q", "0.5", "--rate", "2", "--requests", "30", "--seed", "7",
         "--contexts", "2", "--mean-input", "120", "--max-model-len", "400",
         "--max-output", "50"]


def test_build_writes_a_workload_and_prints_one_summary_line(tmp_path, dataset):
    out = tmp_path / "wl.parquet"
    res = CliRunner().invoke(cli, BUILD + ["--dataset", str(dataset), "-o", str(out)])
    assert res.exit_code == 0, res.output
    w = load_workload(out)
    line = res.stdout.strip()
    assert "\n" not in line and line.startswith(f"wrote {out}: 30 requests, q=0.5")
    assert "40 records read;" in line and line.endswith(f"hash {w.content_hash}")
    assert (len(w), w.meta["seed"], w.meta["contexts"], w.meta["dataset"]) == (
        30, 7, 2, "mine.json")


def test_describe_prints_table_json_and_histogram(tmp_path, dataset):
    out, png = tmp_path / "wl.parquet", tmp_path / "hist.png"
    runner = CliRunner()
    assert runner.invoke(cli, BUILD + ["--dataset", str(dataset), "-o", str(out)]).exit_code == 0
    w = load_workload(out)
    res = runner.invoke(cli, ["workload", "describe", str(out), "--png", str(png)])
    assert res.exit_code == 0, res.output
    assert "p99" in res.output and f"content hash      {w.content_hash}" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = runner.invoke(cli, ["workload", "describe", str(out), "--json"])
    s = json.loads(res.stdout)
    prompt = [r.prompt_len for r in w.requests]
    assert s["requests"] == 30 and s["content_hash"] == w.content_hash
    assert s["input_tokens"]["mean"] == pytest.approx(sum(prompt) / 30)
    assert s["duration_s"] == w.requests[-1].arrival_s
    assert s["offered_input_tok_per_s"] == pytest.approx(sum(prompt) / s["duration_s"])
    assert s["shared_fraction"] == w.meta["shared_requests"] / 30


@pytest.mark.parametrize("content, msg", [
    (None, "Error: dataset file not found: "),
    ('[{"id": "a", "conversations": [}]', "Error: "),
    ('{"id": "a"}\n', "Error: "),
])
def test_missing_or_malformed_dataset_exits_1_with_one_line(tmp_path, content, msg):
    path = tmp_path / "data.json"
    if content is not None:
        path.write_text(content)
    res = CliRunner().invoke(cli, BUILD + ["--dataset", str(path), "-o", str(tmp_path / "o.pq")])
    assert res.exit_code == 2
    assert res.stderr.startswith(msg) and res.stderr.count("\n") == 1
    assert "Traceback" not in res.output and not (tmp_path / "o.pq").exists()


def test_describe_of_a_non_workload_exits_1(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_text("nope")
    res = CliRunner().invoke(cli, ["workload", "describe", str(bad)])
    assert res.exit_code == 2 and res.stderr.startswith("Error: ")
