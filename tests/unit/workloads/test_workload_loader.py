"""ShareGPT parsing: array and JSONL, truncated tails, filtering rules,
one-line errors for broken input, and the atomic on-disk cache."""

import json

import numpy as np
import pyarrow as pa
import pytest

from common.errors import HbenchError
from workloads.sharegpt import loader
from workloads.sharegpt.loader import load_pairs, parse_file


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "_LOADED", {})


def conv(i, *turns):
    return {"id": f"c{i}", "conversations": [{"from": f, "value": v} for f, v in turns]}


RECORDS = [
    conv(0, ("human", "first question"), ("gpt", "first answer"),
         ("human", "follow up"), ("gpt", "second answer")),
    conv(1, ("system", "be nice"), ("human", "hello"), ("gpt", "hi there")),
    conv(2, ("human", "   "), ("gpt", "reply to blank")),  # blank human turn: no pair
    conv(3, ("human", "unanswered")),  # no reply: no pair
    conv(4, ("gpt", "speaks first"), ("human", "then human"), ("bing", "not gpt")),
    conv(5),
    conv(6, ("human", "é ü 中文"), ("gpt", "ok")),
]


def test_array_pairs_follow_the_filtering_rules(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(RECORDS, indent=2, ensure_ascii=False))
    p = parse_file(path)
    assert (p.records_read, p.truncated, len(p), p.conversations) == (7, False, 4, 3)
    assert p.conv.tolist() == [0, 0, 1, 6]
    assert [p.turn(i) for i in range(4)] == ["first question", "follow up", "hello", "é ü 中文"]
    assert [p.reply(i) for i in range(4)] == ["first answer", "second answer", "hi there", "ok"]


def test_jsonl_gives_the_same_pairs(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    p = parse_file(path)
    assert (p.records_read, p.truncated, len(p)) == (7, False, 4)
    assert p.human.to_pylist() == parse_file(_write_array(tmp_path)).human.to_pylist()


def _write_array(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(RECORDS))
    return path


@pytest.mark.parametrize("cut", [10, 40, 90])
def test_truncated_array_keeps_complete_records(tmp_path, cut):
    text = json.dumps(RECORDS, indent=2, ensure_ascii=False)
    last = text.rindex('"id": "c6"')
    path = tmp_path / "t.json"
    path.write_bytes(text[: last + cut].encode("utf-8"))
    p = parse_file(path)
    assert (p.records_read, p.truncated, len(p)) == (6, True, 3)


def test_array_without_closing_bracket_is_truncated_but_complete(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(RECORDS, indent=2)[:-2])
    p = parse_file(path)
    assert (p.records_read, p.truncated, len(p)) == (7, True, 4)


def test_cut_inside_a_multibyte_character_is_truncation(tmp_path):
    data = json.dumps(RECORDS, ensure_ascii=False).encode("utf-8")
    cut = data.index("中".encode()) + 1
    path = tmp_path / "t.json"
    path.write_bytes(data[:cut])
    p = parse_file(path)
    assert (p.records_read, p.truncated) == (6, True)


@pytest.mark.parametrize("content, msg", [
    ('[{"id": 1, "conversations": []},, ]', "malformed JSON at line 1 column 33"),
    ('[{"id": 1, "conversations": []} {"id": 2}]', "expected ',' or ']'"),
    ('[{"id": 1, "conversations": [{"from": "human", "value": 3}]}]', "without string"),
    ('[{"id": 1, "turns": []}]', "no 'conversations' list"),
    ("[1, 2]", "no 'conversations' list"),
    ('"just a string"', "not a JSON array or JSON Lines"),
    ("", "empty file"),
    ("[]", "no complete ShareGPT records"),
    (b"[\xff\xfe" + b" " * 10 + b"]", "not UTF-8"),
])
def test_malformed_files_raise_one_line_errors(tmp_path, content, msg):
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(HbenchError, match=msg) as err:
        parse_file(path)
    assert "\n" not in str(err.value)


def test_missing_dataset_is_a_user_error(tmp_path):
    with pytest.raises(HbenchError, match="dataset file not found"):
        load_pairs(tmp_path / "nope.json")


def test_cache_is_written_once_and_read_back_identically(tmp_path, monkeypatch):
    path = _write_array(tmp_path)
    first = load_pairs(path)
    files = list((tmp_path / "cache").glob("sharegpt-pairs/*.arrow"))
    assert len(files) == 1 and not list((tmp_path / "cache").glob("*.tmp"))
    monkeypatch.setattr(loader, "_LOADED", {})
    monkeypatch.setattr(loader, "parse_file", lambda *a, **k: pytest.fail("cache not used"))
    again = load_pairs(path)
    assert again is not first
    assert (again.records_read, again.truncated, again.key) == (7, False, first.key)
    np.testing.assert_array_equal(again.conv, first.conv)
    assert again.human.equals(first.human) and again.gpt.equals(first.gpt)


def test_cached_texts_read_the_same_after_their_pages_are_released(tmp_path, monkeypatch):
    """The cache's texts are read in place from the memory map (no copy) and
    read back unchanged after `release_pages` drops them from memory."""
    path = _write_array(tmp_path)
    first = load_pairs(path)
    monkeypatch.setattr(loader, "_LOADED", {})
    mapped = load_pairs(path)                   # from the cache file
    assert mapped.human.equals(first.human) and mapped.gpt.equals(first.gpt)
    assert isinstance(mapped.human, pa.Array) and isinstance(mapped.gpt, pa.Array)
    before = [mapped.turn(i) for i in range(len(mapped))]
    loader.release_pages()
    assert [mapped.turn(i) for i in range(len(mapped))] == before
    assert [mapped.reply(i) for i in range(len(mapped))] == [first.reply(i)
                                                             for i in range(len(first))]


def test_changed_file_gets_a_new_cache_key(tmp_path):
    path = _write_array(tmp_path)
    key = load_pairs(path).key
    path.write_text(json.dumps(RECORDS[:2]))
    p = load_pairs(path)
    assert p.key != key and p.records_read == 2


def test_corrupt_cache_is_reparsed(tmp_path, monkeypatch):
    path = _write_array(tmp_path)
    load_pairs(path)
    (cache_file,) = (tmp_path / "cache").glob("sharegpt-pairs/*.arrow")
    cache_file.write_bytes(b"garbage")
    monkeypatch.setattr(loader, "_LOADED", {})
    assert load_pairs(path).records_read == 7


def test_a_kept_copy_with_rows_cut_is_parsed_again_with_one_line(tmp_path, monkeypatch, capsys):
    """A valid Arrow file with half the pairs, written where the cache keeps
    the pairs, has another sha256 than its record: the source is parsed again
    and the legitimate pairs replace it."""
    from common import cache

    monkeypatch.setattr(cache, "_NOTED", set())
    path = _write_array(tmp_path)
    first = load_pairs(path)
    (cache_file,) = (tmp_path / "cache").glob("sharegpt-pairs/*.arrow")
    table = pa.ipc.open_file(pa.py_buffer(cache_file.read_bytes())).read_all()
    with pa.OSFile(str(cache_file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table.slice(0, 2))
    monkeypatch.setattr(loader, "_LOADED", {})
    capsys.readouterr()
    again = load_pairs(path)
    assert len(again) == len(first) and again.human.equals(first.human)
    (line,) = capsys.readouterr().err.splitlines()
    assert str(cache_file) in line and "computing it again" in line
    monkeypatch.setattr(loader, "_LOADED", {})
    monkeypatch.setattr(loader, "parse_file", lambda *a, **k: pytest.fail("cache not rewritten"))
    assert len(load_pairs(path)) == len(first)
