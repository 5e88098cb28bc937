"""A run, and each cell of a sweep, resolves its model, layout and budget
once (`harness.run_setup`): validation's `RunSetup` is the one the run uses."""

from __future__ import annotations

from click.testing import CliRunner

from harness.run_setup import RunSetup
from hbench.cli import cli

SMALL = ["--budget", "b83", "--requests", "8", "--rate", "4"]


def count_resolutions(monkeypatch) -> list:
    calls = []
    real = RunSetup.resolve.__func__

    def resolve(cls, config):
        calls.append(config)
        return real(cls, config)

    monkeypatch.setattr(RunSetup, "resolve", classmethod(resolve))
    return calls


def test_a_run_resolves_its_setup_once(tmp_path, monkeypatch):
    for extra in (["--json"], []):   # with and without the progress display
        calls = count_resolutions(monkeypatch)
        res = CliRunner().invoke(cli, ["run", "--out", str(tmp_path), "--org", "d0", *SMALL,
                                       *extra])
        assert res.exit_code == 0, res.output
        assert [c.org for c in calls] == ["d0"]


def test_a_sweep_resolves_each_cell_once(tmp_path, monkeypatch):
    calls = count_resolutions(monkeypatch)
    res = CliRunner().invoke(cli, ["sweep", "--org", "s0,d0", *SMALL, "--jobs", "1",
                                   "--out", str(tmp_path / "sw")])
    assert res.exit_code == 0, res.output
    assert sorted(c.org for c in calls) == ["d0", "s0"]


def test_advise_resolves_each_planned_run_once(tmp_path, monkeypatch):
    """Its up-front check, the smaller-budget probe's refusal check and the
    sweep share one checked setup per run."""
    calls = count_resolutions(monkeypatch)
    out = tmp_path / "adv"
    res = CliRunner().invoke(cli, ["advise", "--requests", "8", "--seeds", "1-2", "--orgs", "s2,d0",
                                   "--budget", "b83", "--at-rate", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    digests = [c.digest() for c in calls]
    assert len(digests) == len(set(digests)) >= 4
    runs = {p.parent.name for p in out.glob("*/manifest.json")}
    assert len(runs) == len(digests)
