"""`StepTable` reads as the list of row dicts it stores, by row and by column."""

import math

import numpy as np
import pandas as pd
import pytest

import harness.step_table as step_table
from harness.step_table import StepTable, has_step_key, step_values, steps_frame
from tests.support.compare import same

ROWS = [
    {"time_s": 0.5, "start_s": 0.0, "waiting": 3, "bound": "memory", "ids": "", "occ": math.nan},
    {"time_s": 1.5, "start_s": 0.5, "waiting": 0, "bound": "compute", "ids": "4,7", "occ": 0.25},
]


def table(rows=ROWS) -> StepTable:
    t = StepTable()
    t.set_columns(rows[0])
    for r in rows:
        t.append(tuple(r.values()))
    return t


def test_rows_read_back_as_the_dicts_they_came_from():
    t = table()
    assert len(t) == 2 and list(t) == ROWS and t[1] == ROWS[1] and t[-1] == ROWS[-1]
    assert list(t[1:]) == ROWS[1:]


def test_columns_and_frame_equal_the_list_of_dicts():
    t = table()
    assert step_values(t, "waiting") == step_values(ROWS, "waiting") == [3, 0]
    assert step_values(t, "absent") == step_values(ROWS, "absent") == [None, None]
    assert has_step_key(t, "occ") and has_step_key(ROWS, "occ")
    assert not has_step_key(t, "absent") and not has_step_key(StepTable(), "occ")
    pd.testing.assert_frame_equal(steps_frame(t), pd.DataFrame(ROWS), check_exact=True)
    assert steps_frame(StepTable()).equals(pd.DataFrame([]))


def test_select_keeps_rows_in_order():
    assert list(table().select([False, True])) == ROWS[1:]


# Columns of every kind a packed chunk must keep as pandas would type them:
# floats, ints, ints and floats (float64), strings, None among floats (NaN),
# bools, a NumPy scalar, an int past int64.
MIXED = [
    {"f": 0.5, "i": 3, "mix": 1, "s": "", "none": None, "b": True, "np": np.float64(1.5),
     "big": 2**70},
    {"f": math.nan, "i": -2, "mix": 2.5, "s": "4,7", "none": 0.25, "b": False,
     "np": np.float64(2.0), "big": 1},
    {"f": 1e300, "i": 0, "mix": 7, "s": "memory", "none": 3.0, "b": True, "np": np.float64(0.0),
     "big": 5},
    {"f": -0.0, "i": 2**40, "mix": 8, "s": "x", "none": None, "b": False, "np": np.float64(-1.0),
     "big": 6},
    {"f": 2.0, "i": 1, "mix": 9.0, "s": "", "none": 1.0, "b": True, "np": np.float64(3.0),
     "big": 7},
]


@pytest.mark.parametrize("chunk", [1, 2, 3, 4096])
def test_rows_packed_by_column_read_and_frame_as_the_rows(chunk, monkeypatch):
    """Packed every ``chunk`` rows, a table reads back row by row, by column,
    selected and sliced as its rows, and frames as `from_records` of them."""
    monkeypatch.setattr(step_table, "CHUNK_ROWS", chunk)
    t = table(MIXED)
    assert len(t) == len(MIXED)
    cols = list(MIXED[0])
    expected = pd.DataFrame.from_records([tuple(r.values()) for r in MIXED], columns=cols)
    pd.testing.assert_frame_equal(t.to_frame(), expected, check_exact=True)
    pd.testing.assert_frame_equal(t.to_frame(), pd.DataFrame(MIXED), check_exact=True)
    for k, row in enumerate(MIXED):
        for got in (t[k], t[k - len(MIXED)], list(t)[k]):
            assert list(got) == cols and all(same(got[c], row[c]) for c in cols), (k, got)
    for c in cols:
        assert all(same(a, float(b) if c == "mix" else b)
                   for a, b in zip(t.column(c), [r[c] for r in MIXED], strict=True))
    assert t.array("f").dtype == np.float64 and t.array("i").dtype == np.int64
    assert t.array("mix").dtype == np.float64 and isinstance(t.array("s"), list)
    assert t.array("absent") is None
    keep = [True, False, True, True, False]
    picked = t.select(keep)
    pd.testing.assert_frame_equal(picked.to_frame().reset_index(drop=True),
                                  expected[keep].reset_index(drop=True), check_exact=True)
    pd.testing.assert_frame_equal(
        t[1:4].to_frame(),
        pd.DataFrame.from_records([tuple(r.values()) for r in MIXED[1:4]], columns=cols),
        check_exact=True)
    assert len(t.select([False] * 5)) == 0 and t.select([False] * 5).to_frame().empty


def test_a_table_written_a_chunk_at_a_time_reads_back_as_its_frame(tmp_path, monkeypatch):
    """Numeric and string columns go to Parquet chunk by chunk, one row
    group each, and read back as `to_frame` (what pandas wrote before); a
    table with another kind of column is written through its frame."""
    monkeypatch.setattr(step_table, "CHUNK_ROWS", 2)
    rows = ROWS * 3 + [{**ROWS[0], "waiting": 2**40, "occ": 1}]   # int64; ints among floats
    t = table(rows)
    t.write_parquet(tmp_path / "steps.parquet")
    import pyarrow.parquet as pq

    assert pq.ParquetFile(tmp_path / "steps.parquet").metadata.num_row_groups == 4
    back = pd.read_parquet(tmp_path / "steps.parquet")
    pd.testing.assert_frame_equal(back, t.to_frame(), check_exact=True)
    pd.testing.assert_frame_equal(back, pd.DataFrame(rows), check_exact=True)
    mixed = table([{k: v for k, v in r.items() if k != "big"} for r in MIXED])   # bools, None
    mixed.write_parquet(tmp_path / "mixed.parquet")
    mixed.to_frame().to_parquet(tmp_path / "frame.parquet", index=False)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "mixed.parquet"),
                                  pd.read_parquet(tmp_path / "frame.parquet"), check_exact=True)


def _spilled_and_kept(rows, monkeypatch, chunk=2):
    monkeypatch.setattr(step_table, "CHUNK_ROWS", chunk)
    kept, spilled = StepTable(), StepTable()
    spilled.spill()
    for t in (kept, spilled):
        t.set_columns(rows[0])
        for r in rows:
            t.append(tuple(r.values()))
    return kept, spilled


def _same_tables(a: StepTable, b: StepTable) -> None:
    pd.testing.assert_frame_equal(a.to_frame(), b.to_frame(), check_exact=True)
    assert len(a) == len(b) and a.columns == b.columns
    for x, y in zip(a, b, strict=True):
        assert all(same(x[c], y[c]) for c in a.columns), (x, y)
    for k in (0, len(a) // 2, -1):
        assert all(same(a[k][c], b[k][c]) for c in a.columns)
    for c in a.columns:
        assert all(same(x, y) for x, y in zip(a.column(c), b.column(c), strict=True))
    keep = [k % 3 != 1 for k in range(len(a))]
    pd.testing.assert_frame_equal(a.select(keep).to_frame(), b.select(keep).to_frame(),
                                  check_exact=True)
    pd.testing.assert_frame_equal(a.select(keep, ("waiting", "ids")).to_frame(),
                                  b.select(keep, ("waiting", "ids")).to_frame(), check_exact=True)


def test_a_spilled_table_holds_no_packed_chunk_and_writes_the_same_file(tmp_path, monkeypatch):
    """Spilled, a table keeps no packed chunk in memory, reads as the same
    table kept, and writes the same Parquet file (ints in a column the first
    chunk made floats are written as floats, as the kept table's frame has them)."""
    rows = ROWS * 3 + [{**ROWS[1], "waiting": 2**40, "occ": 1}]
    kept, spilled = _spilled_and_kept(rows, monkeypatch)
    assert len(spilled._chunks) == 3 and all(c is None for c in spilled._chunks)
    assert len(kept._chunks) == 3 and all(c is not None for c in kept._chunks)
    _same_tables(kept, spilled)
    kept.write_parquet(tmp_path / "kept.parquet")
    spilled.write_parquet(tmp_path / "spilled.parquet")
    assert (tmp_path / "kept.parquet").read_bytes() == (tmp_path / "spilled.parquet").read_bytes()
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "spilled.parquet"),
                                  pd.DataFrame(rows), check_exact=True)
    _same_tables(kept, spilled)          # still readable once written


def test_a_table_told_to_spill_after_k_chunks_keeps_them_until_one_more(tmp_path, monkeypatch):
    """``spill(after_chunks=2)``: two chunks stay in memory and no file is made
    (sealed there, the rows stay too); the third chunk sends all three to the
    file. Either way the table reads and writes as the one kept in memory."""
    monkeypatch.setattr(step_table, "CHUNK_ROWS", 2)
    rows = ROWS * 3 + [{**ROWS[1], "waiting": 2**40, "occ": 1}]     # 4 rows: two chunks
    kept, lazy = StepTable(), StepTable()
    lazy.spill(after_chunks=2)
    for t in (kept, lazy):
        t.set_columns(rows[0])
        for r in rows[:4]:
            t.append(tuple(r.values()))
    assert lazy._spill is None and len(lazy._chunks) == 2
    lazy.seal()
    assert lazy._spill is None and all(c is not None for c in lazy._chunks)
    _same_tables(kept, lazy)
    for t in (kept, lazy):
        t.append(tuple(rows[4].values()))
    lazy.seal()                                  # two chunks and a row: one more chunk
    assert lazy._spilled == 3 and all(c is None for c in lazy._chunks)
    assert len(lazy._spill.parts) == 1 and not lazy.rows
    _same_tables(kept, lazy)
    kept.write_parquet(tmp_path / "kept.parquet")
    lazy.write_parquet(tmp_path / "lazy.parquet")
    assert (tmp_path / "kept.parquet").read_bytes() == (tmp_path / "lazy.parquet").read_bytes()


def test_a_short_simulated_run_makes_no_spill_file_and_writes_the_same_steps(tmp_path,
                                                                           monkeypatch):
    """The simulator's table spills only past `SPILL_AFTER_CHUNKS` chunks: a
    short run makes no file, and its steps.parquet has the same bytes as the
    same run's spilled from its first chunk."""
    from click.testing import CliRunner

    from hbench.cli import cli

    made = []
    real = step_table._Spill.__init__
    monkeypatch.setattr(step_table._Spill, "__init__",
                        lambda self: real(self) or made.append(self.dir))
    written = {}
    for after in (step_table.SPILL_AFTER_CHUNKS, 0):
        monkeypatch.setattr(step_table, "SPILL_AFTER_CHUNKS", after)
        out = tmp_path / f"after{after}"
        result = CliRunner().invoke(cli, ["run", "--org", "s2", "--budget", "b83", "--rate", "3",
                                          "--requests", "40", "--seed", "1", "--out", str(out)])
        assert result.exit_code == 0, result.output
        (steps,) = out.glob("*/steps.parquet")
        written[after] = steps.read_bytes()
        assert len(made) == (0 if after else 1)
    assert written[0] == written[step_table.SPILL_AFTER_CHUNKS]


def test_a_spilled_table_read_midway_goes_on_in_a_new_part(tmp_path, monkeypatch):
    rows = ROWS * 4
    kept, spilled = _spilled_and_kept(rows[:5], monkeypatch)
    assert spilled.column("waiting") == kept.column("waiting")      # closes the first part
    assert list(spilled._spill._readers) == [0]                     # and keeps it open to read
    for t in (kept, spilled):
        for r in rows[5:]:
            t.append(tuple(r.values()))
    assert len(spilled._spill.parts) == 2
    assert spilled._spill._readers == {}      # a new part began: the open readers were closed
    _same_tables(kept, spilled)
    kept.write_parquet(tmp_path / "kept.parquet")
    spilled.write_parquet(tmp_path / "spilled.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "kept.parquet"),
                                  pd.read_parquet(tmp_path / "spilled.parquet"), check_exact=True)


@pytest.mark.parametrize("late", [{"waiting": 0.5}, {"ids": None}])
def test_a_chunk_that_cannot_be_spilled_brings_the_table_back(late, tmp_path, monkeypatch):
    """Floats under a column the first chunk made ints, a None among strings:
    the chunks on disk come back into memory and the table reads and writes
    as one that never spilled."""
    rows = ROWS * 2 + [{**ROWS[0], **late}, ROWS[1]]
    kept, spilled = _spilled_and_kept(rows, monkeypatch)
    assert spilled._spill is None and all(c is not None for c in spilled._chunks)
    _same_tables(kept, spilled)
    kept.write_parquet(tmp_path / "kept.parquet")
    spilled.write_parquet(tmp_path / "spilled.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "kept.parquet"),
                                  pd.read_parquet(tmp_path / "spilled.parquet"), check_exact=True)


def test_a_spilled_table_opens_each_part_once_to_read_all_its_columns(monkeypatch):
    import pyarrow.parquet as pq

    kept, spilled = _spilled_and_kept(ROWS * 3, monkeypatch)
    spilled.seal()
    opened = []
    real = pq.ParquetFile
    monkeypatch.setattr(pq, "ParquetFile", lambda *a, **k: opened.append(a) or real(*a, **k))
    for c in spilled.columns:
        assert all(same(x, y) for x, y in zip(spilled.column(c), kept.column(c), strict=True))
    assert all(same(spilled[0][c], kept[0][c]) for c in kept.columns)
    assert len(opened) == len(spilled._spill.parts) == 1
    spilled._spill.remove()
    assert spilled._spill._readers == {}


def test_a_spilled_table_removes_its_file_when_dropped(monkeypatch):
    import gc
    import os

    _, spilled = _spilled_and_kept(ROWS * 2, monkeypatch)
    where = spilled._spill.dir
    assert os.path.isdir(where)
    del spilled
    gc.collect()
    assert not os.path.exists(where)


def test_a_sealed_spilled_table_is_one_file_that_frames_through_arrow(tmp_path, monkeypatch):
    rows = ROWS * 2 + [ROWS[0]]
    kept, spilled = _spilled_and_kept(rows, monkeypatch)
    spilled.seal()
    assert not spilled.rows and all(c is None for c in spilled._chunks)
    _same_tables(kept, spilled)
    pd.testing.assert_frame_equal(kept.to_frame(("start_s", "ids", "waiting")),
                                  spilled.to_frame(("start_s", "ids", "waiting")),
                                  check_exact=True)
    spilled.write_parquet(tmp_path / "spilled.parquet")
    kept.write_parquet(tmp_path / "kept.parquet")
    assert len(spilled._spill.parts) == 1
    assert (tmp_path / "kept.parquet").read_bytes() == (tmp_path / "spilled.parquet").read_bytes()


def test_a_killed_process_spill_directory_is_removed_by_the_next_table(tmp_path, monkeypatch):
    """SIGKILL leaves a process's spill directory behind; a later table removes
    it once it has been quiet for ORPHAN_QUIET_S, and never touches one whose
    process is alive (this one's) or one changed recently."""
    import os
    import signal
    import subprocess
    import sys
    import time

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(step_table.tempfile, "tempdir", None)     # re-read TMPDIR
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from harness.step_table import StepTable\n"
         "t = StepTable(); t.spill(); t.set_columns({'a': 0})\n"
         "import harness.step_table as s; s.CHUNK_ROWS = 2\n"
         "[t.append((i,)) for i in range(5)]\n"
         "print(t._spill.dir, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    left = child.stdout.readline().strip()
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert os.path.dirname(left) == str(tmp_path) and os.listdir(left), left

    mine = tmp_path / f"{step_table.SPILL_PREFIX}{os.getpid()}-x"     # a live process's
    mine.mkdir()
    other = tmp_path / "hbench-steps-notapid"
    other.mkdir()
    step_table.remove_orphaned_spills()             # the orphan changed just now: kept
    assert os.path.isdir(left)
    old = time.time() - step_table.ORPHAN_QUIET_S - 1
    for d in (left, mine, other):
        for f in [d, *(os.path.join(d, n) for n in os.listdir(d))]:
            os.utime(f, (old, old))
    _, spilled = _spilled_and_kept(ROWS * 2, monkeypatch)          # a new table's spill
    assert not os.path.exists(left)
    assert mine.is_dir() and other.is_dir() and os.path.isdir(spilled._spill.dir)
