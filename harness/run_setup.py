"""A run's configuration together with what it resolves to, built once.

A `RunConfig` names a model (preset or config.json), a state dtype, an
organization under a paging and a budget label; turning those into a
`ModelGeometry`, the organization's `OrgLayout` and its `OrgBudget` is done
here, once per run: `validate` resolves it before any work, and the result
travels as one frozen value to the run (`hbench.runner.execute` takes it
from ``hbench run``, and from each sweep cell, `hbench.sweep.Cell.setup`).
Validation checks it, the runner records it in the manifest, and the engine
builds its organization, pools and cost model from it. No engine re-reads a
config.json, re-derives a layout or re-resolves a budget, so what the
manifest says and what the engine ran cannot disagree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.errors import HbenchError
from harness.budget import OrgBudget, resolve_budget
from harness.config import (
    MAX_RUN_MEMORY_BYTES,
    RUN_BYTES_PER_PAGE,
    RunConfig,
    run_bytes,
)
from harness.geometry import ModelGeometry
from harness.layout import Grid, OrgLayout
from harness.model_configs import geometry_for_run
from harness.orgs import layout_for
from harness.run_grid import run_grid


@dataclass(frozen=True)
class RunSetup:
    config: RunConfig
    geometry: ModelGeometry
    layout: OrgLayout       # the organization's layout under the run's paging
    budget: OrgBudget
    grid: Grid | None = None   # the grid the layout was laid out on (harness/run_grid.py)

    @classmethod
    def resolve(cls, config: RunConfig) -> RunSetup:
        """Resolve ``config``'s model, layout and budget (HbenchError if the
        model or the budget is unknown)."""
        geom = geometry_for_run(config)
        grid = run_grid(config, geom)
        layout = layout_for(config.org, geom, config.resolved_paging, grid)
        return cls(config, geom, layout,
                   resolve_budget(config.budget, layout, geom, config.d0_attn_fraction, grid),
                   grid)

    def with_config(self, config: RunConfig) -> RunSetup:
        """The same resolution under a config that differs only in what the
        geometry and budget do not depend on (e.g. a saved workload's recipe)."""
        for name in ("model", "config_path", "ssm_state_dtype", "budget", "org",
                     "d0_attn_fraction", "resolved_paging", "grid_from", "shared_block_tokens",
                     "dual_block_tokens", "dual_grid_tokens"):
            assert getattr(config, name) == getattr(self.config, name), name
        return dataclasses.replace(self, config=config)


def validate(config: RunConfig) -> RunSetup:
    """Refuse (HbenchError, one line) a config that cannot run sensibly, before
    any work: a ``--token-budget`` below the organization's grid (a prefill
    chunk could never be scheduled), and a run estimated to need more than
    `MAX_RUN_MEMORY_BYTES` (its requests plus the simulator's pages). Whether
    the simulated GPU holds the weights and the budget is the simulator's
    check (`adapters.sim.profile.check_gpu_memory`). Resolves the model, the
    layout and the budget once (an unknown model, config.json or budget label
    fails here) and returns them as a `RunSetup` for the run to use."""
    setup = RunSetup.resolve(config)
    budget = setup.budget
    grid = setup.layout.grid_tokens
    if config.token_budget < grid:
        raise HbenchError(f"--token-budget {config.token_budget} is smaller than {config.org}'s "
                          f"grid of {grid} tokens; the minimum for {config.org} is {grid}")
    check_policies(config, setup.layout)
    requests, mean_prompt = run_requests(config)
    pages = budget.total_pages if config.engine == "sim" else 0
    check_memory(requests, mean_prompt, pages, made_on_read=config.made_on_read)
    return setup


#: Engines whose organization hbench builds, hence takes the checkpoint policies.
POLICY_ENGINES = ("sim", "torch")


def check_policies(config: RunConfig, layout: OrgLayout) -> None:
    """Refuse checkpoint policies (``--ckpt-publish``, ``--ckpt-evict``) other
    than the study's where they cannot apply: on a served engine (the server
    decides) and, for a publish policy, under in-place publication (vLLM's
    pages publish at the edges vLLM keeps)."""
    if config.ckpt_publish == "every" and config.ckpt_evict == "lru":
        return
    if config.engine not in POLICY_ENGINES:
        raise HbenchError(f"--ckpt-publish {config.ckpt_publish} / --ckpt-evict {config.ckpt_evict}: "
                          f"checkpoint policies apply to the engines {', '.join(POLICY_ENGINES)}, "
                          f"not {config.engine} (its server decides)")
    if config.ckpt_publish != "every" and layout.publish_in_place:
        raise HbenchError(f"--ckpt-publish {config.ckpt_publish} needs the study's pages; "
                          f"--paging vllm publishes in place at the edges vLLM keeps")


def run_requests(config: RunConfig) -> tuple[float, float]:
    """(requests, mean prompt tokens) a run serves: the recipe's, or a saved
    workload's from its Parquet footer (`workloads.io.stored_size`: read
    before the workload is loaded, so a file too large to run is refused
    without loading it); a multi-turn file counts ``max_turns`` per session,
    as a multi-turn recipe does."""
    if not config.workload_path:
        return config.expected_requests, config.mean_input
    from workloads.bounds import expected_requests
    from workloads.io import stored_size

    rows, tokens, meta = stored_size(config.workload_path)
    turns = meta.get("max_turns")
    kind = meta.get("workload_kind", "sharegpt")
    n = expected_requests(rows, None, 0.0, kind, turns if isinstance(turns, int) and turns >= 1 else 1)
    return n, tokens / rows if rows else 0.0


def check_memory(requests: float, mean_prompt: float, pages: int = 0,
                 subject: str = "this run", *, made_on_read: bool = False) -> None:
    """Refuse (HbenchError) work estimated to need more than
    `MAX_RUN_MEMORY_BYTES`: ``requests`` requests of ``mean_prompt`` prompt
    tokens (`harness.config.run_bytes`) plus ``pages`` simulated pages. Runs
    check it in `validate`; ``hbench workload build`` checks the recipe's
    requests before deriving, since a workload too large to run is useless
    and deriving it costs memory of the same order. ``made_on_read``: the
    run's workload is made request by request as it is served
    (`RunConfig.made_on_read`), so its prompts are not held."""
    need = run_bytes(requests, mean_prompt, made_on_read=made_on_read) + RUN_BYTES_PER_PAGE * pages
    if need > MAX_RUN_MEMORY_BYTES:
        what = f"{requests:,.0f} requests of {mean_prompt:.0f} prompt tokens"
        raise HbenchError(
            f"{subject} would need about {need / 2**30:,.1f} GiB of memory "
            f"({what}" + (f", {pages:,} pages" if pages else "") + "); the limit is "
            f"{MAX_RUN_MEMORY_BYTES / 2**30:.0f} GiB: ask for fewer requests"
            + (" or a smaller budget" if pages else ""))
