"""`scripts/kernel_check.sh --dry-run`: the GPU check of the state kernels runs end to end.

On CPU, through Triton's interpreter, at toy sizes: every organization's
kernel rows, the engine's before/after decode runs and the files the GPU run
writes. It proves the check runs, not how fast anything is.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"      # before triton is first imported
pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("safetensors")

from hbench.kernel_check import ORGS, main  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def test_the_dry_run_writes_every_table(tmp_path):
    main(tmp_path, "cpu", dry_run=True)
    report = json.loads((tmp_path / "kernel_check.json").read_text())
    rows = report["kernels"]["rows"]
    assert {(r["org"], r["batch"]) for r in rows} == {(o, b) for o in ORGS for b in (1, 2)}
    assert all(r["ssm_paged_s"] > 0 and r["conv_dense_s"] > 0 for r in rows)
    runs = report["engine"]["runs"]
    assert runs["s2 before"]["state_kernels"] == "torch"
    assert runs["s2 after"]["state_kernels"] == "triton"
    assert runs["s2 after"]["decode_steps"] == runs["s2 before"]["decode_steps"] > 0
    md = (tmp_path / "kernel_check.md").read_text()
    lines = [line for line in md.splitlines() if line.startswith(("| s", "| d"))]
    assert len(lines) == len(rows) + len(runs)
    assert "copy bandwidth" in (tmp_path / "kernel_check.log").read_text()
