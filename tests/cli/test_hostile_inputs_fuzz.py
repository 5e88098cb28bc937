"""Fuzzed flag values: whatever hypothesis draws for a numeric or path flag of
``run``, ``budget`` or ``sweep --dry-run`` (huge, negative, NaN, non-ASCII,
empty, very long), the command either works (exit 0) or refuses in one
``Error:`` line (exit 2), raises nothing (no traceback), and answers quickly.

The runs are kept tiny (4 requests) so a value that happens to be valid
costs little; ~50 examples in all."""

from __future__ import annotations

import os
import time

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hbench.cli import cli

SECONDS = 20.0
HOSTILE_TEXT = st.one_of(
    st.sampled_from(["", " ", "nan", "-nan", "inf", "-inf", "1e400", "-1e400", "1e-300",
                     "0", "-0", "-1", "0x10", "1_000", "８３", "١٢", "b８３", "12ＧiB",
                     "9" * 5000, "b" + "9" * 5000, "9" * 5000 + "p", "\x00", "../..",
                     "a" * 300, "/dev/null", "//"]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=40),
)
RUN_FLAGS = ["--requests", "--rate", "--seed", "--q", "--duration", "--cap", "--token-budget",
             "--headroom", "--burstiness", "--contexts", "--mean-input", "--max-output",
             "--max-model-len", "--budget", "--warmup", "--d0-attn-fraction", "--gpu",
             "--workload", "--config", "--out"]
SWEEP_FLAGS = ["--seeds", "--rate", "--q", "--budget", "--requests", "--cap", "--headroom",
               "--gpu", "--out", "--jobs"]


def _check(args: list[str], tmp_path) -> None:
    t0 = time.monotonic()
    res = CliRunner().invoke(cli, args)
    assert time.monotonic() - t0 < SECONDS, args
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        f"{args}: {res.exception!r}\n{res.output[-2000:]}")
    assert res.exit_code in (0, 2), (args, res.output[-2000:])
    if res.exit_code == 2:
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error:"), (args, res.output)


def _text(value: str) -> str:
    return value.replace("\x00", "")   # argv cannot carry NUL


FUZZ = settings(max_examples=20, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(flag=st.sampled_from(RUN_FLAGS), value=HOSTILE_TEXT)
def test_run_survives_any_flag_value(tmp_path, monkeypatch, flag, value):
    monkeypatch.chdir(tmp_path)
    out = ["--out", str(tmp_path / "out")] if flag != "--out" else []
    _check(["run", "--requests", "4", "--rate", "4", *out, flag, _text(value)], tmp_path)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=HOSTILE_TEXT, fraction=st.one_of(st.none(), HOSTILE_TEXT))
def test_budget_survives_any_label(tmp_path, value, fraction):
    extra = [] if fraction is None else ["--d0-attn-fraction", _text(fraction)]
    _check(["budget", _text(value), *extra], tmp_path)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(SWEEP_FLAGS), value=HOSTILE_TEXT)
def test_sweep_dry_run_survives_any_axis_value(tmp_path, monkeypatch, flag, value):
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    out = ["--out", str(tmp_path / "sweep")] if flag != "--out" else []
    seeds = [] if flag == "--seeds" else ["--seeds", "1"]
    _check(["sweep", "--dry-run", "--requests", "4", *seeds, *out, flag, _text(value)], tmp_path)
    assert sorted(os.listdir(tmp_path)) == before   # a dry run writes nothing
