"""Derived workloads kept on disk (`workloads.derived_cache`): a workload read
back is the one derivation gives (requests, dtypes, meta, content hash), it
is read only for the same recipe, corpus and code, a damaged file is derived
again, and the directory stays under its size bound."""

from __future__ import annotations

import json

import numpy as np
import pytest

import workloads.build as build
from workloads import derived_cache as D
from workloads.spec import WorkloadSpec

SPEC = dict(seed=3, q=0.5, rate=2.0, requests=12, contexts=3, max_model_len=2048,
            max_output=64, mean_input_tokens=600)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "derived"
    monkeypatch.setattr(D, "directory", lambda: folder)
    return folder


def _derive_fails(monkeypatch):
    monkeypatch.setattr(build, "_derive", lambda *a: pytest.fail("derived, not read back"))


def _same(a, b) -> None:
    assert a.content_hash == b.content_hash
    assert json.dumps(a.meta) == json.dumps(b.meta)
    for x, y in zip(a.requests, b.requests, strict=True):
        assert (x.request_id, x.arrival_s, x.prompt_text, x.output_len, x.prefix_group,
                x.prefix_tokens, x.salt) == (y.request_id, y.arrival_s, y.prompt_text,
                                             y.output_len, y.prefix_group, y.prefix_tokens, y.salt)
        assert x.prompt_token_ids.dtype == y.prompt_token_ids.dtype
        assert np.array_equal(x.prompt_token_ids, y.prompt_token_ids)


def test_a_workload_read_back_is_the_derived_one(cache, monkeypatch):
    derived = build.build_workload(**SPEC)
    assert len(list(cache.glob("*.arrow"))) == 1
    _derive_fails(monkeypatch)
    kept = build.build_workload(**SPEC)
    assert kept is not derived
    _same(kept, derived)
    isolated = dict(SPEC, isolate=True)
    monkeypatch.undo()
    monkeypatch.setattr(D, "directory", lambda: cache)
    salted = build.build_workload(**isolated)
    _derive_fails(monkeypatch)
    _same(build.build_workload(**isolated), salted)   # salts (strings) come back too


def test_another_recipe_or_other_code_is_derived_again(cache, monkeypatch):
    spec = WorkloadSpec(**SPEC)
    key = D.derived_key(spec)
    assert key == D.derived_key(WorkloadSpec(**SPEC))
    assert D.derived_key(WorkloadSpec(**dict(SPEC, seed=4))) != key
    assert D.derived_key(WorkloadSpec(**dict(SPEC, rate=2.5))) != key
    monkeypatch.setattr(D, "source_digest", lambda: "edited")
    assert D.derived_key(spec) != key


def test_workloads_it_does_not_keep(cache, tmp_path):
    spec = WorkloadSpec(**SPEC)
    assert D.derived_key(spec, tokenizer=tmp_path / "tokenizer.json") is None
    assert D.derived_key(WorkloadSpec(**dict(SPEC, dataset=str(tmp_path / "x.json")))) is None
    assert D.derived_key(WorkloadSpec(**dict(SPEC, workload_kind="multiturn"))) is None


def test_an_edited_meta_is_derived_again_with_one_line(cache, monkeypatch, capsys):
    """The meta is outside the stream hash: the file's recorded sha256 covers it."""
    import pyarrow as pa

    from common import cache as C

    monkeypatch.setattr(C, "_NOTED", set())
    derived = build.build_workload(**SPEC)
    (file,) = cache.glob("*.arrow")
    table = pa.ipc.open_file(pa.py_buffer(file.read_bytes())).read_all()
    md = dict(table.schema.metadata)
    meta = json.loads(md[D._META])
    md[D._META] = json.dumps({**meta, "requests": 999}).encode()
    with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table.replace_schema_metadata(md))
    capsys.readouterr()
    _same(build.build_workload(**SPEC), derived)
    (line,) = capsys.readouterr().err.splitlines()
    assert str(file) in line and "computing it again" in line


def test_a_damaged_file_is_derived_again_and_replaced(cache, monkeypatch):
    derived = build.build_workload(**SPEC)
    (file,) = cache.glob("*.arrow")
    file.write_bytes(file.read_bytes()[:-200])   # cut short
    assert D.read(file.stem) is None
    _same(build.build_workload(**SPEC), derived)
    assert D.read(file.stem) is not None
    # a file whose requests do not hash to its stored content hash is refused
    wrong = derived.__class__(requests=derived.requests, meta=derived.meta)
    wrong.__dict__["content_hash"] = "0" * 64
    D.write(file.stem, wrong)
    assert D.read(file.stem) is None


def test_the_least_recently_used_files_go_first(tmp_path):
    import os

    for i, name in enumerate(("old", "mid", "new")):
        f = tmp_path / f"{name}.arrow"
        f.write_bytes(b"x" * 100)
        os.utime(f, ns=(i * 10**9, i * 10**9))
    D._prune(tmp_path, 250)
    assert sorted(f.stem for f in tmp_path.glob("*.arrow")) == ["mid", "new"]
