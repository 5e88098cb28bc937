"""Organizations are compared at equal memory on every engine and paging.

A budget label (``bN`` or a whole-model size) is one byte target per pool
layer; each organization turns it into its own whole pages and keeps its own
rounding loss (harness/budget.py); u0's one region is whole attention
blocks, e0 starts from D0's split. So what an engine is given
(`OrgBudget.allocated_bytes`: the whole pages, and vLLM's null block) never
exceeds the target and falls short of it by less than the organization's
largest page: any two organizations' allocations differ by less than one
page. Under vLLM's paging every organization has the same page, so the block
counts are equal outright. ``Np`` labels are excluded by design: they count
each organization's own pages.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from harness.budget import applicable_orgs, resolve_all, vllm_blocks
from harness.config import ORG_NAMES
from harness.layout import PAGINGS
from harness.model_configs import PRESETS, preset
from hbench.cli import cli

HYBRIDS = sorted(n for n in PRESETS if preset(n).slot_checkpoint_bytes)


def assert_equal_bytes(label: str, name: str, paging: str, fraction: float = 0.5) -> None:
    geom = preset(name)
    budgets = resolve_all(label, geom, fraction, paging)
    assert set(budgets) == set(applicable_orgs(geom))
    targets = {b.target_bytes for b in budgets.values()}
    assert len(targets) == 1, targets                       # one byte target for all
    (target,) = targets
    page = max(b.largest_page_bytes for b in budgets.values())
    for org, b in budgets.items():
        assert target - b.largest_page_bytes < b.allocated_bytes <= target, (org, b)
    alloc = [b.allocated_bytes for b in budgets.values()]
    assert max(alloc) - min(alloc) < page, (label, name, paging, alloc)
    if paging == "vllm":
        assert len({b.total_pages for b in budgets.values()}) == 1
        assert len({vllm_blocks(label, org, geom) for org in budgets}) == 1


@pytest.mark.parametrize("paging", PAGINGS)
@pytest.mark.parametrize("name", HYBRIDS)
@pytest.mark.parametrize("label", ["b8", "b63", "b83", "b108", "12GiB", "40GB"])
def test_the_studys_budgets_give_every_organization_equal_bytes(label, name, paging):
    assert_equal_bytes(label, name, paging)


@given(n=st.integers(min_value=8, max_value=5000), paging=st.sampled_from(PAGINGS),
       name=st.sampled_from(HYBRIDS), fraction=st.sampled_from([0.25, 0.5, 0.75]))
def test_any_bn_budget_gives_every_organization_equal_bytes(n, paging, name, fraction):
    assert_equal_bytes(f"b{n}", name, paging, fraction)


@given(mib=st.integers(min_value=4096, max_value=400_000), paging=st.sampled_from(PAGINGS),
       name=st.sampled_from(HYBRIDS))
def test_any_whole_model_size_gives_every_organization_equal_bytes(mib, paging, name):
    assert_equal_bytes(f"{mib}MiB", name, paging)


def test_a_run_manifest_records_the_bytes_the_engine_was_given(tmp_path):
    """The simulator at --paging vllm serves what a vLLM server at the same
    label is given: every organization the same allocated bytes."""
    allocated = {}
    for org in ORG_NAMES:
        out = tmp_path / org
        res = CliRunner().invoke(cli, ["run", "--org", org, "--budget", "b83", "--paging", "vllm",
                                       "--requests", "6", "--rate", "4", "--out", str(out), "--json"])
        assert res.exit_code == 0, res.output
        run_dir = json.loads(res.output)["run_dir"]
        manifest = json.loads((tmp_path / org / run_dir.rsplit("/", 1)[-1] / "manifest.json")
                              .read_text())
        b = manifest["budget"]
        assert b["allocated_whole_model_bytes"] == b["allocated_bytes_per_pool_layer"] * b["pool_layers"]
        allocated[org] = b["allocated_bytes_per_pool_layer"]
    assert len(set(allocated.values())) == 1, allocated


@pytest.mark.slow
def test_a_vllm_paging_sweep_report_shows_the_bytes_each_organization_was_given(tmp_path):
    import re

    from analysis.load import load_runs

    out = tmp_path / "sweep"
    res = CliRunner().invoke(cli, ["sweep", "--org", "s0,s1,s2,d0", "--budget", "b24",
                                   "--paging", "vllm", "--seeds", "1", "--requests", "8",
                                   "--rate", "4", "--set", "mean_input=2600",
                                   "--set", "max_model_len=4096", "--set", "max_output=32",
                                   "--set", "token_budget=1664", "--out", str(out)])
    assert res.exit_code == 0, res.output
    runs = load_runs(out)
    assert runs["allocated_bytes"].nunique() == 1 and runs["allocated_bytes"].iloc[0] > 0
    res = CliRunner().invoke(cli, ["report", str(out), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    text = re.sub(r"<[^>]+>", " ", (tmp_path / "r.html").read_text())
    section = text[text.index("Memory given"):text.index("TTFT attribution", text.index("Memory given"))]
    mib = f"{runs['allocated_bytes'].iloc[0] / 2**20:,.2f}"
    assert section.count(mib) == 4, section        # one row per organization, the same bytes
