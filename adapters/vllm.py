"""``--engine vllm``: the workload against a real vLLM server.

Stock vLLM V1 with prefix caching is S0-like: for a hybrid model it pads the
Mamba page until attention and Mamba pages are equal (one shared pool of
equal pages) and reuses a prefix only where the attention blocks and a Mamba
state at the same block boundary are both cached (the joint hit rule, Mamba
cache mode ``align``). So this engine expresses organization ``s0`` only.

Knob mapping (checked against the installed vLLM's source, not assumed):

    --cap        -> --max-num-seqs
    budget       -> --num-gpu-blocks-override on GPU (hbench's S0 page count for
                    the run's geometry, --ssm-dtype included); on CPU block
                    counts follow VLLM_CPU_KVCACHE_SPACE and are only
                    recorded, not controlled
    --ssm-dtype  -> --mamba-ssm-cache-dtype on GPU, so vLLM's SSM state has
                    the dtype the block count was sized with; on CPU the
                    model runs in float32 and the flag is not passed
    headroom > 0 -> refused: vLLM V1 has no admission watermark
    retention    -> refused: vLLM has no retention policy
    SHARE/ISOLATE-> per-request ``cache_salt`` (the workload's salts)

CPU specifics (vllm-cpu): float32 and ``--enforce-eager``; an explicit
attention ``--block-size`` with ``--max-num-batched-tokens`` no larger than
it, because with prefix caching on, prefill chunks longer than one attention
block crash the CPU Mamba kernel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from adapters.served_engine import ServedEngine
from adapters.server_process import split_command
from harness.errors import HbenchError

DEFAULT_SERVER = "{python} -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port {port} --model {model}"
CPU_BLOCK_SIZE = 128        # vLLM's own choice for tiny hybrids on CPU; pinned so chunks fit
CPU_KV_GIB = "1"            # VLLM_CPU_KVCACHE_SPACE default for launched CPU servers
VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # hbench -> vLLM


def vllm_python() -> str:
    """The interpreter that has vLLM: $HBENCH_VLLM_PYTHON, else this one."""
    return os.environ.get("HBENCH_VLLM_PYTHON") or sys.executable


def installed_distribution(python: str) -> tuple[str, str] | None:
    """(distribution, version) of vLLM in ``python``'s environment, or None.

    Reads package metadata only (importing vLLM takes tens of seconds).
    """
    code = ("import importlib.metadata as m, json\n"
            "for d in ('vllm-cpu', 'vllm'):\n"
            "    try: print(json.dumps([d, m.version(d)])); break\n"
            "    except m.PackageNotFoundError: pass\n")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = out.stdout.strip()
    return tuple(json.loads(line)) if line else None


def source_has(python: str, relpath: str, needle: str) -> bool:
    """Whether the installed vLLM's ``relpath`` mentions ``needle`` (feature probe)."""
    code = "import importlib.util; print(importlib.util.find_spec('vllm').submodule_search_locations[0])"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
        return needle in (Path(out.stdout.strip()) / relpath).read_text()
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return False


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

    try:
        geom = geometry_for_run(config)
    except HbenchError:
        return None
    return resolve_budget(config.budget, "s0", geom).pools[0]


class VllmEngine(ServedEngine):
    name = "vllm"
    supported_orgs = ("s0",)
    metrics = "vllm"
    extra_body = {"return_token_ids": True}

    def __init__(self, python: str | None = None, cpu: bool | None = None,
                 align: bool | None = None, ssm_cache_dtype: bool | None = None,
                 cpu_block_size: int = CPU_BLOCK_SIZE, **kwargs):
        """``cpu``, ``align`` (has --mamba-cache-mode) and ``ssm_cache_dtype``
        (has --mamba-ssm-cache-dtype) are probed from the installed vLLM when None."""
        super().__init__(**kwargs)
        self.python = python or vllm_python()
        self._dist = None
        self._cpu = cpu
        self._align = align
        self._ssm_cache_dtype = ssm_cache_dtype
        self.cpu_block_size = cpu_block_size

    def distribution(self) -> tuple[str, str] | None:
        if self._dist is None:
            self._dist = installed_distribution(self.python) or ()
        return self._dist or None

    @property
    def cpu(self) -> bool:
        if self._cpu is None:
            dist = self.distribution()
            self._cpu = bool(dist) and dist[0] == "vllm-cpu"
        return self._cpu

    def version(self) -> str:
        dist = self.distribution()
        return f"{dist[0]}-{dist[1]}" if dist else "vllm-unknown"

    headroom_note = " (V1 has no admission watermark)"

    def check_config(self, config) -> None:
        super().check_config(config)
        if config.launch and self.cpu and config.cap > self.cpu_block_size:
            raise HbenchError(f"--cap {config.cap} exceeds the CPU step size {self.cpu_block_size} "
                              "tokens (vLLM needs max-num-seqs <= max-num-batched-tokens)")

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
            b = str(self.cpu_block_size)
            argv += ["--dtype", "float32", "--enforce-eager",
                     "--block-size", b, "--max-num-batched-tokens", b]
        else:
            pool = s0_pool(config)
            if pool is not None:
                argv += ["--num-gpu-blocks-override", str(pool.pages)]
            # The block count is sized with --ssm-dtype's SSM state; make vLLM keep it so.
            if self._ssm_cache_dtype is None:
                self._ssm_cache_dtype = source_has(self.python, "config/cache.py",
                                                   "mamba_ssm_cache_dtype")
            if self._ssm_cache_dtype:
                argv += ["--mamba-ssm-cache-dtype", VLLM_DTYPES[config.ssm_state_dtype]]
        return argv

    def requested_info(self, config) -> dict:
        """Adds hbench's S0 pool for the budget (``s0_pool``: page bytes and
        pages; None without a known geometry) and the SSM state dtype it was
        sized with. On GPU a launched server gets ``pages`` as its block count."""
        info = super().requested_info(config)
        pool = s0_pool(config)
        info["ssm_state_dtype"] = config.ssm_state_dtype
        info["s0_pool"] = None if pool is None else {"page_bytes": pool.page_bytes,
                                                     "pages": pool.pages}
        return info

    def launch_env(self, config) -> dict:
        return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KV_GIB)}

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
