"""The ``hbench`` entry point ends its process without the collector's last
passes (`hbench.cli.exit_without_collecting`), and what exit must still do
happens: atexit handlers run, stdout arrives whole, the exit status stands,
and a run's temporary step-table directory is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

PROBE = """
import atexit, gc, json, sys
import harness.step_table as st
st.SPILL_AFTER_CHUNKS = 0     # a short run's steps spill too, so that exit must remove them
spills = []
made = st._Spill.__init__
def making(self):
    made(self)
    spills.append(self.dir)
st._Spill.__init__ = making
note = sys.argv[1]
def at_exit():
    with open(note, "w") as f:
        json.dump({"frozen": gc.get_freeze_count(), "spills": spills}, f)
atexit.register(at_exit)
sys.argv = ["hbench", *sys.argv[2:]]
from hbench.cli import main

main()
"""


def run_main(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    note = tmp_path / "atexit.json"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(note), *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc, json.loads(note.read_text())


@pytest.mark.slow
def test_a_run_ends_frozen_with_atexit_run_stdout_whole_and_no_spill_left(tmp_path):
    proc, note = run_main(tmp_path, "run", "--org", "s2", "--budget", "b83", "--rate", "3",
                          "--requests", "40", "--seed", "1", "--json", "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert note["frozen"] > 0
    summary = json.loads(proc.stdout)
    assert Path(summary["run_dir"], "manifest.json").is_file()
    assert len(note["spills"]) == 1 and Path(note["spills"][0]).parent == tmp_path / "tmp"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_refused_command_keeps_its_exit_status_and_message(tmp_path):
    proc, note = run_main(tmp_path, "budget", "not-a-budget")
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error:")
    assert note["frozen"] > 0
