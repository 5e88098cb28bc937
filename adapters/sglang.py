"""``--engine sglang``: the workload against a real SGLang server.

Stock SGLang serves hybrid models with two native pools, D0-like: a Mamba
state pool (a fixed number of whole-request state slots) beside a token KV
pool, the split fixed at start by ``--mamba-full-memory-ratio`` (Mamba bytes
over full-attention KV bytes) or pinned with ``--max-mamba-cache-size``. So
against a server this engine expresses organization ``d0`` only; in process
(`adapters.sglang_cpu`, neither ``--endpoint`` nor ``--launch``) it also
serves ``u0`` with SGLang's unified memory (``--enable-unified-memory``: one
region whose KV and Mamba sides move).

Knob mapping:

    budget             -> D0's two pools at the budget (`harness.budget.resolve_budget`
                          with D0's study layout, the same bytes every
                          organization gets): --max-total-tokens = the
                          attention pool's blocks x 16 tokens, and
                          --max-mamba-cache-size = its checkpoint units (one
                          SGLang Mamba slot holds one whole state, as one unit
                          does); without a known geometry (a model directory
                          without config.json) the split only:
    d0_attn_fraction f -> --mamba-full-memory-ratio (1 - f) / f
    --cap              -> --max-running-requests
    headroom > 0       -> refused (SGLang has no admission watermark in blocks)
    retention          -> refused
    SHARE/ISOLATE      -> per-request ``cache_salt`` (the workload's salts)

SGLang has no CPU build on these machines: this adapter is tested against
recorded SGLang streams and metrics served by a local fake server, never
against a live SGLang server (docs/engines.md says so too).
"""

from __future__ import annotations

import os
import sys

from adapters.served_engine import ServedEngine
from adapters.server_process import installed_distribution, split_command
from common.code_digest import code_digest
from common.errors import HbenchError

#: Where the import walk of the SGLang engine's code digest starts: this
#: client and the in-process worker (started by module name).
DIGEST_ROOTS = ("adapters.sglang", "adapters.sglang_cpu.worker")

DEFAULT_SERVER = ("{python} -m sglang.launch_server --host 127.0.0.1 --port {port} "
                  "--model-path {model}")


def mamba_full_memory_ratio(d0_attn_fraction: float) -> float:
    """SGLang's Mamba/attention byte ratio for hbench's attention share f."""
    return (1.0 - d0_attn_fraction) / d0_attn_fraction


def memory_limits(config) -> dict | None:
    """SGLang's pool limits for the run's budget: ``max_total_tokens`` (the
    attention pool's tokens) and ``max_mamba_cache_size`` (state slots), or
    None when hbench knows no geometry for the model."""
    from harness.budget import resolve_budget
    from harness.model_configs import geometry_for_run
    from harness.orgs import layout_for

    try:
        geom = geometry_for_run(config)
    except HbenchError:
        return None
    layout = layout_for("d0", geom)
    attn, ckpt = resolve_budget(config.budget, layout, geom, config.d0_attn_fraction).pools
    return {"max_total_tokens": attn.pages * layout.attn_block_tokens,
            "max_mamba_cache_size": ckpt.pages}


class SglangEngine(ServedEngine):
    name = "sglang"
    supported_orgs = ("d0", "u0")
    served_orgs = ("d0",)      # against a server; u0 runs in process only
    metrics = "sglang"
    extra_body = {"return_token_ids": True}

    def __init__(self, python: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.python = python or os.environ.get("HBENCH_SGLANG_PYTHON") or sys.executable

    def run(self, workload, setup, progress=None):
        """Serve on a server (``--endpoint`` or ``--launch``), or with neither,
        in process: SGLang's own pools and radix cache deciding memory, in the
        venv named by ``HBENCH_SGLANG_PYTHON`` (`adapters.sglang_cpu`)."""
        config = setup.config
        if config.launch or config.endpoint:
            return super().run(workload, setup, progress)
        self.check_config(config)
        from adapters.sglang_cpu.engine import run_in_process
        return run_in_process(workload, setup)

    def check_config(self, config) -> None:
        """As every served engine's, and ``u0`` only in process (a server would
        need ``--enable-unified-memory``, which hbench has never driven)."""
        super().check_config(config)
        if (config.launch or config.endpoint) and config.org not in self.served_orgs:
            raise HbenchError(f"organization {config.org} runs on sglang in process only "
                              "(SGLang's unified memory in adapters/sglang_cpu): drop "
                              "--endpoint/--launch and set HBENCH_SGLANG_PYTHON")

    def version(self) -> str:
        """SGLang's version in the interpreter that serves (``self.python``) and
        the digest of hbench's code that drives it (client, in-process worker)."""
        dist = installed_distribution(self.python, ("sglang",))
        return f"sglang-{dist[1] if dist else 'unknown'}-{code_digest(DIGEST_ROOTS)}"

    def launch_argv(self, config, port: int) -> list[str]:
        argv = split_command(config.server_cmd or DEFAULT_SERVER, python=self.python,
                             port=port, model=config.model, host="127.0.0.1")
        argv += [
            "--enable-metrics",
            "--enable-cache-report",
            "--max-running-requests", str(config.cap),
            "--context-length", str(config.max_model_len),
            "--random-seed", str(config.seed),
        ]
        limits = memory_limits(config)
        if limits is None:
            return argv + ["--mamba-full-memory-ratio",
                           f"{mamba_full_memory_ratio(config.d0_attn_fraction):.6g}"]
        return argv + ["--max-total-tokens", str(limits["max_total_tokens"]),
                       "--max-mamba-cache-size", str(limits["max_mamba_cache_size"])]

    def requested_info(self, config) -> dict:
        """Adds the pool limits the server is launched with (None: split only)."""
        info = super().requested_info(config)
        info["memory_limits"] = memory_limits(config)
        return info

    def resolved_info(self, info_labels: dict, log_text: str) -> dict:
        """What SGLang reports about its pools (server_info labels, when published)."""
        keys = ("max_total_num_tokens", "max_running_requests", "max_mamba_cache_size",
                "mamba_full_memory_ratio", "page_size", "context_length")
        out = {k: info_labels[k] for k in keys if k in info_labels}
        out["version"] = self.version()
        return out
