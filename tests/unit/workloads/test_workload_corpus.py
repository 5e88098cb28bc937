"""Any chat corpus through `datasets`: small corpora in each supported format,
made here, and the ones that must be refused."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import HbenchError
from workloads.build import build_workload
from workloads.corpus import load_corpus


def chat(i: int, turns: int = 2) -> list[tuple[str, str]]:
    return [(f"question {i}.{k}: please explain topic number {i} in some detail",
             f"answer {i}.{k}: here is a long explanation of topic {i} with several words")
            for k in range(turns)]


def openai_record(i: int, key: str = "messages") -> dict:
    msgs = [{"role": "system", "content": "be brief"}]
    for q, a in chat(i):
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return {"id": i, key: msgs}


def sharegpt_record(i: int) -> dict:
    conv = []
    for q, a in chat(i):
        conv += [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
    return {"id": str(i), "conversations": conv}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_sharegpt_jsonl_uses_the_sharegpt_parser_and_records_the_file_hash(tmp_path):
    f = write_jsonl(tmp_path / "sg.jsonl", [sharegpt_record(i) for i in range(5)])
    pairs = load_corpus(f)
    assert len(pairs) == 10 and pairs.records_read == 5
    assert pairs.identity["format"] == "sharegpt"
    assert pairs.identity["sha256"] == hashlib.sha256(b"sg.jsonl\0" + f.read_bytes()).hexdigest()


@pytest.mark.slow
def test_openai_messages_jsonl_is_read_through_datasets(tmp_path):
    records = [openai_record(i) for i in range(4)]
    records.append({"id": 98, "messages": []})                                   # no messages
    records.append({"id": 99, "messages": [{"role": "user", "content": "hi there you"}]})
    pairs = load_corpus(write_jsonl(tmp_path / "oa.jsonl", records))
    assert len(pairs) == 8
    assert pairs.turn(0).startswith("question 0.0") and pairs.reply(1).startswith("answer 0.1")
    ident = pairs.identity
    assert ident["format"] == "messages (role/content)" and ident["records_read"] == 6
    assert ident["records_skipped"] == {"no message list": 1, "no user/assistant pair": 1}


def test_conversation_column_in_a_json_array(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps([openai_record(i, "conversation") for i in range(3)]))
    pairs = load_corpus(f)
    assert len(pairs) == 6 and pairs.identity["format"] == "conversation (role/content)"


def test_parquet_file_and_folder_of_jsonl(tmp_path):
    table = pa.Table.from_pylist([openai_record(i) for i in range(3)])
    pq.write_table(table, tmp_path / "c.parquet")
    assert len(load_corpus(tmp_path / "c.parquet")) == 6
    folder = tmp_path / "parts"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [openai_record(i) for i in range(2)])
    write_jsonl(folder / "b.jsonl", [openai_record(i) for i in range(2, 5)])
    pairs = load_corpus(folder)
    assert pairs.records_read == 5 and pairs.identity["files"] == 2
    assert pairs.identity["source"] == "folder"


def test_saved_datasets_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([sharegpt_record(i) for i in range(3)])
    ds.save_to_disk(str(tmp_path / "saved"))
    pairs = load_corpus(tmp_path / "saved")
    assert len(pairs) == 6 and pairs.identity["source"] == "saved dataset"
    assert pairs.identity["format"] == "conversations (from/value)"


def test_chat_column_given_by_name(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [openai_record(i, "dialog") for i in range(3)])
    with pytest.raises(HbenchError, match="not a recognized chat corpus.*--chat-column"):
        load_corpus(f)
    assert len(load_corpus(f, chat_column="dialog")) == 6
    with pytest.raises(HbenchError, match="no column 'talk'"):
        load_corpus(f, chat_column="talk")


def test_unrecognized_corpora_are_refused_in_one_line(tmp_path):
    text = write_jsonl(tmp_path / "t.jsonl", [{"text": "plain text"}] * 3)
    with pytest.raises(HbenchError, match=r"columns: text") as e:
        load_corpus(text)
    assert "\n" not in str(e.value)
    keys = write_jsonl(tmp_path / "k.jsonl", [{"messages": [{"speaker": "a", "t": "b"}]}])
    with pytest.raises(HbenchError, match="neither from/value nor role/content"):
        load_corpus(keys)
    nopair = write_jsonl(tmp_path / "n.jsonl", [{"messages": [{"role": "user", "content": "x"}]}])
    with pytest.raises(HbenchError, match="no user/assistant pair in 1 records"):
        load_corpus(nopair)
    (tmp_path / "empty").mkdir()
    with pytest.raises(HbenchError, match="no JSON, JSONL or Parquet"):
        load_corpus(tmp_path / "empty")
    with pytest.raises(HbenchError, match="dataset file not found"):
        load_corpus(tmp_path / "missing.jsonl")


def test_multiturn_workload_from_a_corpus_records_its_identity(tmp_path):
    f = write_jsonl(tmp_path / "oa.jsonl", [openai_record(i) for i in range(6)])
    w = build_workload(seed=1, q=1.0, rate=1.0, requests=4, workload_kind="multiturn",
                       dataset=f)
    ident = w.meta["dataset_identity"]
    assert ident["records_read"] == 6 and ident["source"] == "file"
    assert all(len(s.turns) == 1 for s in w.sessions)   # two pairs per conversation
    first = w.requests[0]
    assert first.prompt_text.startswith("question ")
    assert w.sessions[0].turns[0].user_text.startswith("\n\nquestion ")


def test_workload_build_cli_takes_a_corpus(tmp_path):
    from click.testing import CliRunner

    from hbench.cli import cli
    from workloads.io import load_workload

    f = write_jsonl(tmp_path / "oa.jsonl", [openai_record(i) for i in range(6)])
    out = tmp_path / "w.parquet"
    res = CliRunner().invoke(cli, ["workload", "build", "--workload-kind", "multiturn",
                                   "--requests", "3", "--dataset", str(f), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert load_workload(out).meta["dataset_identity"]["format"] == "messages (role/content)"
    bad = write_jsonl(tmp_path / "t.jsonl", [{"text": "plain"}])
    res = CliRunner().invoke(cli, ["workload", "build", "--dataset", str(bad), "-o", str(out)])
    assert res.exit_code != 0
    assert res.output.strip().startswith("Error:") and len(res.output.strip().splitlines()) == 1


def test_run_takes_a_corpus_and_records_it(tmp_path):
    from click.testing import CliRunner

    from harness.results import read_run
    from hbench.cli import cli

    f = write_jsonl(tmp_path / "oa.jsonl", [openai_record(i, "dialog") for i in range(8)])
    out = tmp_path / "runs"
    res = CliRunner().invoke(cli, ["run", "--workload-kind", "multiturn", "--requests", "4",
                                   "--dataset", str(f), "--chat-column", "dialog", "--org", "s2",
                                   "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    run = read_run(next(p for p in out.iterdir() if p.is_dir()))
    assert run["manifest"]["config"]["dataset"] == str(f)
    ident = run["manifest"]["workload_meta"]["dataset_identity"]
    assert ident["format"] == "dialog (role/content)" and ident["records_read"] == 8
    assert run["summary"]["later_turns"] == 4
