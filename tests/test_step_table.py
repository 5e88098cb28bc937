"""`StepTable` reads as the list of row dicts it stores, by row and by column."""

import math

import pandas as pd

from harness.step_table import StepTable, has_step_key, step_values, steps_frame

ROWS = [
    {"time_s": 0.5, "start_s": 0.0, "waiting": 3, "bound": "memory", "ids": "", "occ": math.nan},
    {"time_s": 1.5, "start_s": 0.5, "waiting": 0, "bound": "compute", "ids": "4,7", "occ": 0.25},
]


def table(rows=ROWS) -> StepTable:
    t = StepTable()
    t.set_columns(rows[0])
    t.rows.extend(tuple(r.values()) for r in rows)
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
