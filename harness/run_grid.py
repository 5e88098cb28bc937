"""A run's grid: where its pages and checkpoints fall, and where that came from.

`RunConfig.grid_from` picks the grid (`harness.layout.grid_for`): what the
model declares (a preset's, or its config.json's ``hbench_grid``; the
geometry rule's where it declares none), the rule itself (`rule_grid`), or an
engine's shape (`vllm_grid`, `sglang_grid`); ``shared_block_tokens``,
``dual_block_tokens`` and ``dual_grid_tokens`` then replace single numbers.
`harness.run_setup.RunSetup` resolves it once per run; the runner records
`grid_record` in the manifest and a run's title says `grid_words`.
"""

from __future__ import annotations

from harness.layout import GRID_KEYS, Grid, OrgLayout, grid_for


def run_grid(config, geom) -> Grid:
    """The grid ``config`` (a `RunConfig`) asks for, for model geometry ``geom``
    (HbenchError, one line, where the overrides do not fit the grid: a D0
    interval that is not a multiple of its block)."""
    grid = grid_for(geom, config.grid_from)
    return grid.with_overrides(**{key: getattr(config, key) for key in GRID_KEYS})


def grid_record(grid: Grid, layout: OrgLayout, grid_from: str = "declared") -> dict:
    """The manifest's ``grid`` record: the run's organization's attention
    block and checkpoint grid as laid out (under its paging), the grid they
    came from, which one was asked for (``grid_from``) and its source."""
    return {"attn_block_tokens": layout.attn_block_tokens, "grid_tokens": layout.grid_tokens,
            "paging": layout.paging, "grid_from": grid_from, **grid.record()}


def grid_words(record: dict | None) -> str:
    """A run title's words for a manifest's ``grid`` record ("" for a run
    recorded before runs had one)."""
    if not record:
        return ""
    source = record["source"]
    if record.get("overridden"):
        source += ", overridden by " + ", ".join(record["overridden"])
    if record.get("paging", "study") != "study":
        source = f"vLLM's blocks (--paging {record['paging']})"
    block, grid = record["attn_block_tokens"], record["grid_tokens"]
    pages = (f"{block}-token pages, a checkpoint every page" if block == grid
             else f"{block}-token blocks, a checkpoint every {grid} tokens")
    return f"{pages} ({source})"
