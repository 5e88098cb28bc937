"""`common.cache`: an entry is believed only when its digest and its value's
check hold and it was read from a regular file within a bound; anything else
is computed again, with one line on stderr unless the entry is simply absent
or of an older layout."""

from __future__ import annotations

import json
import os
import time

import pytest

from common import cache as C


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("HBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(C, "_NOTED", set())


def positive(entry: dict) -> bool:
    return entry["x"] > 0


def one_note(capsys) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("hbench: ignoring cache entry ") and lines[0].endswith(
        "computing it again")
    return lines[0]


def test_an_entry_reads_back_as_written_in_silence(capsys):
    C.write_entry("k", "n", 3, {"x": 1.5, "key": "n"})
    assert C.read_entry("k", "n", 3, positive) == {"x": 1.5, "key": "n"}
    assert C.read_entry("k", "absent", 3) is None
    assert C.read_entry("k", "n", 4) is None   # an older layout: computed again, no line
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("edit", [
    lambda s: s.replace("1.5", "2.5"),                         # value edited, digest kept
    lambda s: s.replace('"key": "n"', '"key": "m"'),           # another entry's value
    lambda s: s.replace("1.5", "NaN"),
    lambda s: s[:-5],                                          # torn
    lambda s: "[]",
    lambda s: '{"format": 3}',
    lambda s: '{"format": 3, "value": {"x": 1.5, "key": "n"}}',   # no digest
])
def test_an_entry_that_does_not_verify_is_refused_with_one_line(edit, capsys):
    C.write_entry("k", "n", 3, {"x": 1.5, "key": "n"})
    f = C.entry_file("k", "n")
    f.write_text(edit(f.read_text()))
    assert C.read_entry("k", "n", 3, positive) is None
    assert C.read_entry("k", "n", 3, positive) is None   # said once a process
    assert str(f) in one_note(capsys)


def test_a_value_out_of_range_is_refused_even_with_a_matching_digest(capsys):
    C.write_entry("k", "n", 3, {"x": -1.0})
    assert C.read_entry("k", "n", 3, positive) is None
    assert "out of range" in one_note(capsys)


def test_a_fifo_or_a_device_is_never_opened(tmp_path, capsys):
    f = C.entry_file("k", "fifo")
    f.parent.mkdir(parents=True)
    os.mkfifo(f)
    os.symlink("/dev/zero", C.entry_file("k", "zero"))
    t0 = time.monotonic()
    assert C.read_entry("k", "fifo", 1) is None
    assert C.read_entry("k", "zero", 1) is None
    assert time.monotonic() - t0 < 10
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all("not a regular file" in ln for ln in lines)


def test_an_entry_over_the_bound_is_not_read(capsys):
    f = C.entry_file("k", "big")
    f.parent.mkdir(parents=True)
    with open(f, "wb") as out:
        out.truncate(C.MAX_ENTRY_BYTES + 1)   # sparse: large without the disk
    assert C.read_entry("k", "big", 1) is None
    assert "bytes" in one_note(capsys)


def test_a_kept_file_is_read_only_as_written(tmp_path, capsys):
    f = C.cache_dir() / "t" / "a.bin"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"0123456789")
    C.keep_file(f)
    assert C.verified_bytes(f, 100) == b"0123456789"
    assert bytes(C.verified_map(f, 100)) == b"0123456789"
    assert capsys.readouterr().err == ""
    assert C.verified_bytes(f, 5) is None            # over the reader's bound
    assert "out of range" in one_note(capsys)


@pytest.mark.parametrize("damage", ["flip", "cut", "grow", "fifo", "zero", "no record"])
def test_a_kept_file_that_changed_is_refused_by_both_readers(damage, tmp_path, monkeypatch, capsys):
    f = C.cache_dir() / "t" / "a.bin"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"0123456789")
    C.keep_file(f)
    if damage == "flip":
        f.write_bytes(b"0123456780")
    elif damage == "cut":
        f.write_bytes(b"01234")
    elif damage == "grow":
        f.write_bytes(b"0123456789" * 3)
    elif damage == "no record":
        C.record_file(f).unlink()
    else:
        f.unlink()
        if damage == "fifo":
            os.mkfifo(f)
        else:
            os.symlink("/dev/zero", f)
    assert C.verified_bytes(f, 100) is None
    monkeypatch.setattr(C, "_NOTED", set())
    assert C.verified_map(f, 100) is None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(str(f) in ln for ln in lines), lines


def test_an_entry_is_json_with_its_digest(tmp_path):
    C.write_entry("k", "n", 3, {"x": 1})
    stored = json.loads(C.entry_file("k", "n").read_text())
    assert stored == {"format": 3, "value": {"x": 1}, "digest": C._digest("k", "n", 3, {"x": 1})}
