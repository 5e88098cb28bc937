"""``--engine sglang``: the workload against a real SGLang server.

Stock SGLang serves hybrid models with two native pools, D0-like: a Mamba
state pool (a fixed number of whole-request state slots) beside a token KV
pool, the split fixed at start by ``--mamba-full-memory-ratio`` (Mamba bytes
over full-attention KV bytes) or pinned with ``--max-mamba-cache-size``. So
this engine expresses organization ``d0`` only.

Knob mapping:

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
from adapters.server_process import split_command

DEFAULT_SERVER = ("{python} -m sglang.launch_server --host 127.0.0.1 --port {port} "
                  "--model-path {model}")


def mamba_full_memory_ratio(d0_attn_fraction: float) -> float:
    """SGLang's Mamba/attention byte ratio for hbench's attention share f."""
    return (1.0 - d0_attn_fraction) / d0_attn_fraction


class SglangEngine(ServedEngine):
    name = "sglang"
    supported_orgs = ("d0",)
    metrics = "sglang"
    extra_body = {"return_token_ids": True}

    def __init__(self, python: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.python = python or os.environ.get("HBENCH_SGLANG_PYTHON") or sys.executable

    def version(self) -> str:
        from importlib import metadata

        try:
            return f"sglang-{metadata.version('sglang')}"
        except metadata.PackageNotFoundError:
            return "sglang-unknown"

    def launch_argv(self, config, port: int) -> list[str]:
        argv = split_command(config.server_cmd or DEFAULT_SERVER, python=self.python,
                             port=port, model=config.model, host="127.0.0.1")
        return argv + [
            "--enable-metrics",
            "--enable-cache-report",
            "--max-running-requests", str(config.cap),
            "--mamba-full-memory-ratio", f"{mamba_full_memory_ratio(config.d0_attn_fraction):.6g}",
            "--context-length", str(config.max_model_len),
            "--random-seed", str(config.seed),
        ]

    def resolved_info(self, info_labels: dict, log_text: str) -> dict:
        """What SGLang reports about its pools (server_info labels, when published)."""
        keys = ("max_total_num_tokens", "max_running_requests", "max_mamba_cache_size",
                "mamba_full_memory_ratio", "page_size", "context_length")
        out = {k: info_labels[k] for k in keys if k in info_labels}
        out["version"] = self.version()
        return out
