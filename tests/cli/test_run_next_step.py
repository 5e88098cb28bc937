"""`hbench run` ends a run that is not valid with one line saying why and the
command that finds a rate that is; a valid run prints no such line."""

from __future__ import annotations

from click.testing import CliRunner

from hbench.cli import cli
from hbench.commands.run import next_step


def run_output(tmp_path, *args):
    """``hbench run``'s printed answer for S2 at b63 (60 requests, seed 3)."""
    res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--org", "s2", "--budget", "b63",
                                   "--requests", "60", "--seed", "3", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_overloaded_run_ends_with_the_capacity_command_for_its_arm(tmp_path):
    out = run_output(tmp_path, "--rate", "20")
    lines = [x for x in out.splitlines() if x.startswith("not valid (")]
    assert len(lines) == 1
    line = lines[0]
    assert "overload" in line and "20.0 req/s is more than S2 at b63 sustains" in line
    assert line.endswith("hbench capacity --org s2 --budget b63 --rates 5,10,15,20 --seeds 1-3 --requests 60")


def test_valid_run_prints_no_next_step(tmp_path):
    out = run_output(tmp_path, "--rate", "0.5", "--requests", "30")
    assert "not valid (" not in out and "hbench capacity" not in out


def test_a_failure_that_no_rate_fixes_does_not_point_at_capacity():
    summary = {"validity": {"valid": False, "reasons": ["failures"], "checks": {}}}
    line = next_step(summary, {"org": "s2", "budget": "b83", "rate": 3.0, "requests": 240})
    assert line.startswith("not valid (failures)") and "capacity" not in line
    assert next_step({"validity": {"valid": True, "reasons": []}}, {}) == ""
